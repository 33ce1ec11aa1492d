"""MTTR measured in production equals the dry run's: a dry run kills a pod, the restarted run records the recovery in
its output directory, and `recipekit runs history` prints the MTTR the dry run's judge reported. Slow: ~2 minutes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from recipekit.bundle.build import build
from recipekit.cli import main
from recipekit.runtime.boundary import filenames
from recipekit.validate.dryrun.options import DryRunOptions
from recipekit.validate.dryrun.run import run_dry_run
from recipekit.validate.shared.loader import load_bundle
from recipekit.validate.shared.results import Status
from tests.integration.test_dryrun import _explain, processes_under

pytestmark = pytest.mark.slow

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
    pytest.skip("the training stack is not installed", allow_module_level=True)


def test_runs_history_prints_the_dry_runs_mttr_for_the_same_kill(tmp_path: Path) -> None:
    bundle = build(["recipe=tiny_sft", "parallel=ddp"], tmp_path / "bundle", force=True).path
    options = DryRunOptions(pods=2, steps=6, kill_pod=1, at_step=4, workdir=tmp_path / "work", timeout=420)
    results = {r.id: r for r in run_dry_run(load_bundle(bundle), options)}
    assert processes_under(tmp_path / "work") == []
    resume = results["dryrun.resume"]
    assert resume.status is Status.PASS, _explain(results.values())
    recipe = yaml.safe_load((tmp_path / "work" / "bundle" / filenames.RECIPE_FILE).read_text())
    output_dir = recipe["training_arguments"]["output_dir"]
    printed = CliRunner().invoke(main, ["runs", "history", output_dir, "--json"])
    assert printed.exit_code == 0, printed.output
    history = json.loads(printed.output)
    assert history["restarts"] == 1
    assert history["last_mttr_s"] == resume.details["mttr_s"] > 0
    recovered = history["recoveries"][0]
    assert recovered["resume_step"] == resume.details["resumed_step"] == 3
    assert recovered["interrupted_step"] >= 4 and recovered["steps_lost"] == recovered["interrupted_step"] - 3
    assert recovered["first_step"] == 4
    # why the attempt ended: the killed pod left no record (its processes were SIGKILLed); the Job restarted
    assert recovered["ended"].startswith("pod(s) 1 (rank(s) 1) left no record: killed outright")
    assert recovered["ended"].endswith("the Job: RestartJob (PodFailed)")
    # the dry run's own observation (kill → first step seen) agrees within the time it takes to notice a step
    assert abs(resume.details["mttr_observed_s"] - resume.details["mttr_s"]) < 2.0
