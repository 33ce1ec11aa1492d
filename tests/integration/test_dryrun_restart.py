"""Restarts a user asks for, on simulated pods: `recipekit validate --dry-run --restart checkpoint-4,fresh`.

The run completes, then is restarted twice from the same bundle exactly as on a cluster: `recipekit restart`'s own
code writes the kustomize overlay, the request is read back out of its patch, and every pod starts again with it.
The first restart continues from checkpoint-4 (checkpoint-8 set aside) and retrains steps 5-8 to the same losses;
the second starts fresh (both checkpoints set aside). `recipekit runs history` lists both, and no recovery.
Slow: about two minutes.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.bundle.build import build
from recipekit.cli import main
from recipekit.runtime.volume.restart import SUPERSEDED_DIR
from recipekit.validate.dryrun.options import DryRunOptions
from recipekit.validate.dryrun.run import run_dry_run
from recipekit.validate.shared.loader import load_bundle
from recipekit.validate.shared.results import Status
from tests.integration.test_dryrun import _explain, processes_under

pytestmark = pytest.mark.slow

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
    pytest.skip("the training stack is not installed (pip install 'recipekit[train]')", allow_module_level=True)


def test_a_restart_from_a_checkpoint_and_a_fresh_start_each_recorded_in_runs_history(tmp_path: Path) -> None:
    bundle = build(["recipe=tiny_sft"], tmp_path / "bundle", force=True).path
    options = DryRunOptions(pods=2, restart="checkpoint-4,fresh", workdir=tmp_path / "work", timeout=900)
    results = {r.id: r for r in run_dry_run(load_bundle(bundle), options)}
    assert processes_under(tmp_path / "work") == []
    assert all(r.status is Status.PASS for r in results.values() if r.id.startswith("dryrun.")), _explain(
        results.values()
    )
    restarts = results["dryrun.restart"].details["restarts"]
    assert [r["from"] for r in restarts] == ["checkpoint-4", None]
    assert all(r["final_step"] == 8 for r in restarts)
    assert restarts[0]["retrained_steps"] == [5, 6, 7, 8] and restarts[0]["retrained_loss_max_rel_diff"] <= 1e-4

    history = CliRunner().invoke(main, ["runs", "history", str(tmp_path / "work")])
    assert history.exit_code == 0, history.output
    assert "3 start(s), 0 recovery(ies)" in history.output
    assert f"({restarts[0]['id']}) asked for: from checkpoint-4" in history.output
    assert f"({restarts[1]['id']}) asked for: fresh, from step 0" in history.output
    document = json.loads(CliRunner().invoke(main, ["runs", "history", str(tmp_path / "work"), "--json"]).output)
    assert [r["superseded"] for r in document["restarts_asked"]] == [["checkpoint-8"], ["checkpoint-4", "checkpoint-8"]]
    output = next((tmp_path / "work" / "shared" / "runs").glob("tiny-sft-*"))
    assert sorted(p.name for p in (output / SUPERSEDED_DIR / restarts[1]["id"]).iterdir()) == [
        "checkpoint-4",
        "checkpoint-8",
    ]
    assert (tmp_path / "work" / "restart-1" / "kustomization.yaml").is_file()  # the overlays the pods ran from
    assert not (tmp_path / "bundle-restart").exists()  # nothing written beside the user's bundle
