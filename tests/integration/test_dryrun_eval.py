"""The evaluation after training in `recipekit validate --dry-run`, shown by `recipekit report`.

A bundle built with ``eval.enabled`` (its tasks the Hub's arc_easy and hellaswag); the dry run replaces them by its
tiny local multiple-choice task, trains the twin on two simulated pods, and rank 0 scores the saved twin with
lm-evaluation-harness (its ``hf`` model on the output directory, the locally trained tokenizer beside it). The
judge reads the record back; `recipekit report` of the work directory states the score. Slow: about a minute and a
half (a short dry run: 4 steps).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.bundle.build import build
from recipekit.cli import main
from recipekit.validate.dryrun.options import DryRunOptions
from recipekit.validate.dryrun.run import run_dry_run
from recipekit.validate.dryrun.workdir.tinyeval import ITEMS, TASK
from recipekit.validate.shared.loader import load_bundle
from recipekit.validate.shared.results import Status
from tests.integration.test_dryrun import _explain, processes_under

pytestmark = pytest.mark.slow

_MISSING = [m for m in ("torch", "transformers", "lm_eval") if importlib.util.find_spec(m) is None]
if _MISSING:
    pytest.skip(f"not installed: {', '.join(_MISSING)} (pip install 'recipekit[train]')", allow_module_level=True)


def test_a_dry_runs_benchmark_score_is_in_its_report(tmp_path: Path) -> None:
    bundle = build(["recipe=tiny_sft", "eval.enabled=true"], tmp_path / "bundle", force=True).path
    work = tmp_path / "work"
    results = {r.id: r for r in run_dry_run(load_bundle(bundle), DryRunOptions(steps=4, workdir=work, timeout=600))}
    assert processes_under(work) == []
    assert all(r.status is Status.PASS for r in results.values() if r.id.startswith("dryrun.")), _explain(
        results.values()
    )
    scored = results["dryrun.eval"]
    assert set(scored.details["scores"]) == {f"{TASK} acc"}
    report = CliRunner().invoke(main, ["report", str(work), "--json", "--output", str(tmp_path / "report")])
    assert report.exit_code == 0, report.output
    doc = json.loads(report.output[report.output.index("{") :])
    (score,) = doc["evaluation"]["scores"]
    assert (score["task"], score["metric"], score["samples"]) == (TASK, "acc", ITEMS)
    assert 0.0 <= score["value"] <= 1.0
    rows = dict(map(tuple, doc["how_it_went"]))
    assert rows["evaluation"].startswith("lm_eval 0.4.13 on ")
    assert rows[f"  {TASK} acc"].endswith(f"({ITEMS} items, 0-shot)")
