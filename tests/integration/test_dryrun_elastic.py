"""An elastic bundle loses a node for good and finishes on the pods that are left with no command typed, then grows
back when capacity returns: torchrun's own elastic agent under the bundle's launcher, Volcano's replacement pod.

Two simulated pods and the rendezvous pod run the Job's container commands of a ``cluster.min_nodes=1`` bundle.
Pod 0, the first and the one holding rank 0, is killed at step 7 (whole tree) and stays away; pod 1 is never
touched. Its agent, a client of the rendezvous pod's store, restarts the workers on one pod, which resume
checkpoint-5 at the same global batch with twice the accumulation; at step 8 the replacement pod 0 starts, its agent
joins, the workers are stopped (they finish step 9 and save it) and the run grows back to two pods from checkpoint-9.
Rank 0 moves to pod 1 and back. The judge reads the row ledger against the order itself and the recoveries as
``recipekit runs history`` does. Slow: about 75 s on 2 cores.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.bundle.build import build
from recipekit.cli import main
from tests.integration.test_dryrun import reported

if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "datasets")):
    pytest.skip("the training stack is not installed", allow_module_level=True)

ELASTIC = ["recipe=tiny_sft", "parallel=ddp", "cluster.nodes=2", "cluster.min_nodes=1"]


@pytest.mark.slow
def test_a_node_lost_for_good_shrinks_the_run_and_its_return_grows_it_back(tmp_path: Path) -> None:
    bundle = build(ELASTIC, tmp_path / "bundle").path
    work = tmp_path / "work"
    args = ["validate", str(bundle), "--dry-run", "--steps", "10", "--lose-pod", "0", "--return-at-step", "8"]
    done = CliRunner().invoke(main, [*args, "--workdir", str(work), "--timeout", "600"])
    results = reported(work)
    assert done.exit_code == 0, json.dumps({k: r for k, r in results.items() if r["status"] == "fail"})[-6000:]
    elastic = results["dryrun.elastic"]["details"]
    groups = elastic["groups"]
    assert [g["world_size"] for g in groups] == [2, 1, 2]
    assert [g["resumed_step"] for g in groups] == [None, 5, 9] and [g["first_step"] for g in groups] == [1, 6, 10]
    assert {g["global_batch_size"] for g in groups} == {4}
    assert [g["gradient_accumulation_steps"] for g in groups] == [1, 2, 1]
    assert elastic["lost_at_step"] == 7 and elastic["rows_checked_steps"] == list(range(1, 11))
    for recovered in elastic["recoveries"]:
        assert all(seconds is not None for seconds in recovered["parts_s"].values()), recovered
        assert recovered["mttr_s"] < 300  # the seed's bar for a recovery without a person
    assert results["dryrun.train"]["details"]["final_step"] == 10
    history = CliRunner().invoke(main, ["runs", "history", str(work)])
    assert history.exit_code == 0 and "2 recovery(ies)" in history.output
    told = " ".join(history.output.split())
    assert told.count("torchrun's agents restarted the workers (elastic)") == 2
    assert "pod(s) 0 (rank(s) 0) left no record" in told  # the lost pod, by Volcano's index
    assert "rank 0 (pod 1, host" in told  # the shrunk group's rank 0, stopped to grow: pod 1, not node rank 0
    rendezvous = (work / "logs" / "rdzv-0.log").read_text()
    assert rendezvous.count("serving torchrun's c10d rendezvous store") == 1  # one Job start: one store, kept


def test_a_bundle_that_is_not_elastic_is_not_dry_run_with_a_lost_node(tmp_path: Path) -> None:
    bundle = build(["recipe=tiny_sft", "cluster.nodes=2"], tmp_path / "bundle").path
    done = CliRunner().invoke(main, ["validate", str(bundle), "--dry-run", "--lose-pod", "1"])
    assert done.exit_code == 2 and "Traceback" not in done.output
    assert "--lose-pod needs an elastic bundle (cluster.min_nodes)" in " ".join(done.output.split())
