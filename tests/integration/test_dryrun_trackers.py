"""Experiment trackers in `recipekit validate --dry-run`: W&B, MLflow and SwanLab offline, their own files read back.

The bundle is built for the trackers online (a Secret, an MLflow server); the dry run substitutes their offline mode
(no server is reached from it) and then reads what each wrote with the tracker's own record classes (W&B's and
SwanLab's transaction logs) or as text (MLflow's file store): every loss metrics.jsonl logged must be there, at its
step. The run is killed and resumed, so two attempts report (two tracker runs each). Slow: about two minutes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from recipekit.bundle.build import build
from recipekit.runtime.boundary import filenames
from recipekit.validate.dryrun.judges.trackers import logged_losses, tracker_losses
from recipekit.validate.dryrun.options import DryRunOptions
from recipekit.validate.dryrun.run import run_dry_run
from recipekit.validate.shared.loader import load_bundle
from recipekit.validate.shared.results import Status
from tests.integration.test_dryrun import _explain, processes_under

pytestmark = pytest.mark.slow

TRACKERS = ("wandb", "mlflow", "swanlab")
_MISSING = [m for m in ("torch", "transformers", *TRACKERS) if importlib.util.find_spec(m) is None]
if _MISSING:
    pytest.skip(f"not installed: {', '.join(_MISSING)} (pip install 'recipekit[train]')", allow_module_level=True)


def test_each_trackers_offline_files_hold_the_runs_losses(tmp_path: Path) -> None:
    overrides = [
        "recipe=tiny_sft",
        "train.report_to=[tensorboard,wandb,mlflow,swanlab]",
        "train.tracking.secret=tracker-keys",
        "train.tracking.mlflow_uri=https://mlflow.example.com",
    ]
    bundle = build(overrides, tmp_path / "bundle", force=True).path
    options = DryRunOptions(pods=2, kill_pod=1, at_step=6, workdir=tmp_path / "work", timeout=600)
    results = {r.id: r for r in run_dry_run(load_bundle(bundle), options)}
    assert processes_under(tmp_path / "work") == []
    assert all(r.status is Status.PASS for r in results.values() if r.id.startswith("dryrun.")), _explain(
        results.values()
    )
    tracked = results["dryrun.trackers"]
    assert "wandb, mlflow, swanlab offline" in tracked.reason
    recipe = yaml.safe_load((tmp_path / "work" / "bundle" / filenames.RECIPE_FILE).read_text(encoding="utf-8"))
    output = Path(recipe["training_arguments"]["output_dir"])
    logged = logged_losses(output)
    assert len(logged) > 8  # steps replayed after the kill are logged again, by the second attempt
    assert tracked.details["logged_steps"] == len(logged)
    for tracker in TRACKERS:
        held = set(tracker_losses(output, tracker))
        assert set(logged) <= held, f"{tracker} lacks {sorted(set(logged) - held)[:3]}"
    assert len(list((output / "wandb").glob("offline-run-*"))) == 2  # one W&B run per attempt
    assert not (tmp_path / "bundle" / "wandb").exists()  # nothing is written into the bundle
