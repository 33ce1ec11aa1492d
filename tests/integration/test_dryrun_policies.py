"""The Job's own exitCode policies in `recipekit validate --dry-run`: the simulated controller answers a failed pod
with the action the bundle's volcano-job.yaml gives its exit code (validate/controller.py).

* a pod that stops with the configuration-error code (``ops.testing.user_error_pod``) ends the Job: TerminateJob,
  no retry, no training;
* a pod whose preflight sees the wrong devices (``ops.testing.device_count`` + ``device_count_pod``, once) exits with
  the preflight code; the Job's policy restarts it and the restarted Job trains to the end.

Slow: under a minute each (two pods, four steps).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from recipekit.bundle.build import build
from recipekit.runtime.boundary import exitcodes
from recipekit.validate.dryrun.options import DryRunOptions
from recipekit.validate.dryrun.run import run_dry_run
from recipekit.validate.shared.loader import load_bundle
from recipekit.validate.shared.results import Status
from tests.integration.test_dryrun import _explain, processes_under

pytestmark = pytest.mark.slow

_MISSING = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
if _MISSING:
    pytest.skip(f"the training stack is not installed ({', '.join(_MISSING)})", allow_module_level=True)


def dry_run(tmp_path: Path, *overrides: str) -> dict:
    bundle = build(["recipe=tiny_sft", "parallel=ddp", *overrides], tmp_path / "bundle", force=True).path
    options = DryRunOptions(pods=2, steps=4, workdir=tmp_path / "work", timeout=300)
    results = run_dry_run(load_bundle(bundle), options)
    assert processes_under(tmp_path / "work") == []
    return {r.id: r for r in results}


def test_a_configuration_error_on_one_pod_ends_the_job_without_a_retry(tmp_path: Path) -> None:
    results = dry_run(tmp_path, "ops.testing.user_error_pod=1")
    policy = results["dryrun.policy"]
    assert policy.status is Status.PASS, _explain(results.values())
    assert policy.details["first_failure"] == [1, exitcodes.EXIT_USER_ERROR]
    assert policy.details["action"] == "TerminateJob" and policy.details["attempts"] == 1
    assert policy.details["steps_trained"] == []
    assert results["dryrun.train"].status is Status.SKIP
    assert "ops.testing.user_error_pod: pod 1" in (tmp_path / "work" / "logs" / "pod-1.log").read_text()


def test_a_preflight_failure_on_one_pod_restarts_the_job(tmp_path: Path) -> None:
    results = dry_run(tmp_path, "ops.testing.device_count=3", "ops.testing.device_count_pod=0")
    policy = results["dryrun.policy"]
    assert policy.status is Status.PASS, _explain(results.values())
    assert policy.details["first_failure"][1] == exitcodes.EXIT_PREFLIGHT
    assert policy.details["action"] == "RestartJob" and policy.details["attempts"] == 2
    assert results["dryrun.train"].status is Status.PASS, _explain(results.values())
    assert results["dryrun.preflight"].status is Status.PASS  # the restart's preflight
