"""Preflight finds the slow node and gates on it, in `recipekit validate --dry-run`: two pods of two gloo ranks,
global rank 3 (pod 1) slowed on purpose by the test-only hook ``exitcodes.SLOW_RANK_ENV`` (it waits before each of
preflight's point-to-point transfers and burn-in rounds).

* ``ops.preflight=strict``: the point-to-point matrix names pod 1 as the slow node, every pod exits with the gate's
  own code (``preflight_gate``, TerminateJob) and no step is trained;
* ``ops.preflight=warn``: the same finding is a warning in the report, and the Job trains to the end.

Slow: under two minutes each (two pods, two steps, small probes).
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

#: Small probes: a 4 MB exchange per pair, a 4 MB file per pod; 0.4 s of delay per transfer is far slower. The
#: all-reduce's floor is lowered: gloo on one shared machine is no Ethernet link, and its warning is not the finding.
SMALL = [
    "ops.p2p_size_mb=4",
    "ops.storage_probe_mb=4",
    "ops.allreduce_sizes_mb=[1]",
    "ops.allreduce_iterations=2",
    "ops.bandwidth_warn_fraction=0.001",
]


def dry_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> dict:
    monkeypatch.setenv(exitcodes.SLOW_RANK_ENV, "3:0.4")
    overrides = ["recipe=tiny_sft", "parallel=ddp", f"ops.preflight={mode}", *SMALL]
    bundle = build(overrides, tmp_path / "bundle", force=True).path
    options = DryRunOptions(pods=2, procs_per_pod=2, steps=2, workdir=tmp_path / "work", timeout=300)
    results = run_dry_run(load_bundle(bundle), options)
    assert processes_under(tmp_path / "work") == []
    return {r.id: r for r in results}


def _p2p(results: dict) -> dict:
    return next(c for c in results["dryrun.preflight"].details["checks"] if c["check"] == "p2p")


def test_strict_names_the_slow_node_and_ends_the_job_before_step_one(tmp_path: Path, monkeypatch) -> None:
    results = dry_run(tmp_path, monkeypatch, "strict")
    pre, train = results["dryrun.preflight"], results["dryrun.train"]
    assert pre.status is Status.FAIL and pre.details["training_started"] is False, _explain(results.values())
    assert _p2p(results)["status"] == "warn" and "slow node: pod 1" in _p2p(results)["detail"]
    codes = set(train.details["exit_codes"].values())  # the first pod's gate ends the Job: the other is stopped
    assert exitcodes.EXIT_PREFLIGHT_GATE in codes and codes <= {exitcodes.EXIT_PREFLIGHT_GATE, -15}
    logs = "".join(log.read_text() for log in (tmp_path / "work" / "logs").glob("pod-*.log"))
    assert "preflight failed (ops.preflight: strict): p2p: slow node: pod 1" in logs


def test_warn_names_the_slow_node_and_trains(tmp_path: Path, monkeypatch) -> None:
    results = dry_run(tmp_path, monkeypatch, "warn")
    assert results["dryrun.train"].status is Status.PASS, _explain(results.values())
    assert results["dryrun.preflight"].status is Status.PASS
    assert _p2p(results)["status"] == "warn" and "slow node: pod 1" in _p2p(results)["detail"]
