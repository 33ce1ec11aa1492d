"""Checkpoints through the node-local hot tier (``train.hot_checkpoints``, runtime/volume/hottier.py), in a dry run
of the bundle's own scripts: the Trainer saves to the pod's node-local directory, the drain signs it and copies it to
the shared volume in the background, and a pod killed before its drain finished resumes from the hot tier, newer than
anything on the shared volume and verified like it, row-exact; each drained checkpoint then goes to the cold tier
(``train.cold_checkpoints``), whose copies verify too. Slow: about 2 minutes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from recipekit.bundle.build import build
from recipekit.runtime.boundary import filenames, metricnames, metricslog
from recipekit.runtime.volume import hottier, resume, trust
from recipekit.validate.dryrun.options import DryRunOptions
from recipekit.validate.dryrun.run import run_dry_run
from recipekit.validate.dryrun.workdir.substitutions import COLD_STORE
from recipekit.validate.shared.loader import load_bundle
from recipekit.validate.shared.results import Status
from tests.integration.test_dryrun import _explain, processes_under

pytestmark = pytest.mark.slow

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
    pytest.skip("the training stack is not installed", allow_module_level=True)


def test_a_pod_killed_before_its_drain_resumes_the_newer_hot_copy_row_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # checkpoint-4 is signed in the hot tier and never reaches the shared volume (a pod killed mid-drain): the
    # restart must prefer it over the shared volume, which has nothing
    monkeypatch.setenv(hottier.HOLD_DRAIN_ENV, "4")
    cold = 'train.cold_checkpoints.command=[obsutil,cp,-r,"{checkpoint}","obs://archive/{run}/"]'
    overrides = ["recipe=tiny_sft", "parallel=ddp", "train.hot_checkpoints.medium=hostPath", cold]
    bundle = build(overrides, tmp_path / "bundle", force=True).path
    options = DryRunOptions(pods=1, steps=9, kill_pod=0, at_step=5, workdir=tmp_path / "work", timeout=420)
    results = {r.id: r for r in run_dry_run(load_bundle(bundle), options)}
    assert processes_under(tmp_path / "work") == []
    failed = [r for r in results.values() if r.status is Status.FAIL]
    assert not failed, _explain(results.values())
    resumed = results["dryrun.resume"]
    assert resumed.details["complete_checkpoints_at_restart"] == []  # nothing on the shared volume
    assert resumed.details["hot_checkpoints_at_restart"] == [4]
    assert resumed.details["resumed_step"] == 4 and resumed.details["first_step_after_restart"] == 5
    hot = Path(resumed.details["resumed_from"])
    assert hot.name == "checkpoint-4" and "hot" in hot.parts  # the pod's node-local directory, not the volume

    recipe = yaml.safe_load((tmp_path / "work" / "bundle" / filenames.RECIPE_FILE).read_text())
    output_dir = Path(recipe["training_arguments"]["output_dir"])
    key = (tmp_path / "work" / "secrets" / "run-key").read_bytes().strip()
    # every later checkpoint (8, and 9 at the end) was drained and signed; the hot tier keeps its one (keep: 1)
    for step in (8, 9):
        resume.prove(output_dir / f"checkpoint-{step}", step, recipe["plan"]["run_id"], key)
    assert not list(output_dir.glob(f"{hottier.STAGING_PREFIX}*"))
    assert sorted(p.name for p in hot.parent.iterdir()) == ["checkpoint-9"]
    records = metricslog.read_records(output_dir / filenames.METRICS_FILE)
    drained = metricslog.events(records, metricslog.EVENT_CHECKPOINT_DRAINED)
    assert [r["step"] for r in drained] == [8, 9] and all(r["total"] >= r["seconds"] for r in drained)
    # the cold tier copied what the drain put in place, signed (obsutil is the image's: cp into the work copy here)
    substituted = {s["field"]: s for s in results["dryrun.prepare"].details["substitutions"]}
    assert substituted["recipe.train.cold_checkpoints.command"]["old"].startswith("obsutil cp -r")
    copies = metricslog.events(records, metricslog.EVENT_CHECKPOINT_COLD)
    assert [(r["step"], r["code"]) for r in copies] == [(8, 0), (9, 0)]
    store = tmp_path / "work" / "shared" / COLD_STORE
    for step in (8, 9):
        resume.prove(store / f"checkpoint-{step}", step, recipe["plan"]["run_id"], key)
    # both checkpoint gauges were served with values (the dry run scraped after the drain)
    scraped = results["dryrun.metrics"].details["scraped"]["pods"]
    for name in (metricnames.CHECKPOINT_SECONDS.name, metricnames.CHECKPOINT_TOTAL_SECONDS.name):
        assert all(name in pod["sampled"] for pod in scraped.values()), json.dumps(scraped)[:400]
    assert trust.KEY_ENV  # the pods read the key the Job mounts (the dry run's Secret), as in every dry run
