"""The operations contract of a Megatron run stopped as the kubelet stops a pod: Megatron-Bridge 0.3.1's own
``pretrain()`` at TP 2 × PP 2 on 4 gloo ranks (the first layout of test_megatron_engine.py), started as the launcher
starts a pod's workers, sent SIGTERM at a step.

What the room's operations wiring (runtime/megatron/ops.py) must leave at Bridge's signal handler: a checkpoint of
the step the handler stopped at, signed; every rank's exit ``preempted`` in attempt-ends/; the ``preempted`` record in
metrics.jsonl; and ``recipekit runs history`` naming the attempt's end. On the way, the spike drill makes the last
rank's loss of step 2 ten times: the loss-spike report must name that rank (its TP peer has the same batch and a
tenth of its loss) and each rank's batches by fingerprint. What every attempt leaves (preflight's report,
each step's MFU, recovery.jsonl across a restart, ``runs history`` and ``report``) and the resume from a verified
checkpoint are test_megatron_engine.py's, on the dry runs it already makes: one launch here, not a second.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from recipekit.cli import main
from recipekit.runtime.boundary import exitcodes, filenames, metricslog
from recipekit.runtime.volume import attemptends, recovery
from tests.integration import megatronengine as engine
from tests.integration.megatronengine import Case

pytestmark = [pytest.mark.slow, pytest.mark.longest]

CASE = Case(model="tiny_qwen3", tp=2, pp=2)
HOLD_AT = 3  # every rank holds after step 3 (saved, signed); the SIGTERM comes then
SPIKE_AT, SPIKE_RANK = 2, 3  # the last rank (last pipeline stage, TP rank 1)


@pytest.fixture(scope="module")
def python() -> Path:
    from recipekit.validate.dryrun.workdir.enginevenv import engine_python

    return engine_python(progress=print)


def bundle(root: Path) -> Path:
    """The case's bundle, with preflight's all-reduce at one small size (four CPU ranks share two cores) and the
    spike drill armed."""
    path = engine.make_bundle(root, CASE) / "recipe.yaml"
    text = yaml.safe_load(path.read_text(encoding="utf-8"))
    text["operations"]["preflight"]["allreduce_sizes_mb"] = [1.0]
    text["operations"]["preflight"]["allreduce_iterations"] = 2
    text["operations"]["testing"].update(spike_at_step=SPIKE_AT, spike_rank=SPIKE_RANK)
    path.write_text(yaml.safe_dump(text, sort_keys=False), encoding="utf-8")
    return path


def sigterm_at_hold(root: Path, python: Path, step: int, timeout_s: float = 600) -> int:
    """Start the run, wait until every rank holds after ``step``, SIGTERM torchrun (which passes it on to its
    workers, as the launcher passes the kubelet's on) and wait for the run to end; its exit status."""
    proc = engine.start(root, python, hold_at=step, log_name="stopped.log")
    log = root / "stopped.log"
    try:
        deadline = time.monotonic() + timeout_s
        while "TESTING: holding after step" not in log.read_text(errors="replace"):
            assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before step {step}: see {log}"
            assert time.monotonic() < deadline, f"no hold at step {step} within {timeout_s} s"
            time.sleep(0.5)
        time.sleep(2.0)  # every rank reaches the hold (each prints the line)
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=timeout_s)
    finally:
        engine._kill(proc)


def test_a_sigterm_stopped_megatron_run_leaves_the_trainers_operations_records(python: Path, tmp_path: Path) -> None:
    bundle(tmp_path)
    run = tmp_path / "volume" / "run"
    assert sigterm_at_hold(tmp_path, python, HOLD_AT) != 0
    ends = attemptends.read_ends(run)
    tail = (tmp_path / "stopped.log").read_text(errors="replace")[-4000:]
    assert sorted(e["rank"] for e in ends) == [0, 1, 2, 3], tail
    assert {e["code"] for e in ends} == {exitcodes.EXIT_PREEMPTED}, tail
    stopped_at = {e["step"] for e in ends}
    assert len(stopped_at) == 1 and stopped_at.pop() == HOLD_AT + 1  # Bridge stops after the step in progress
    saved = run / "checkpoints" / f"iter_{HOLD_AT + 1:07d}"
    assert json.loads((saved / filenames.RUN_FILE).read_text())["step"] == HOLD_AT + 1  # saved at the signal, signed

    records = engine.metrics(tmp_path)
    assert [r["step"] for r in records if r.get("event") == metricslog.EVENT_PREEMPTED] == [HOLD_AT + 1]
    assert [r["event"] for r in recovery.read(run)] == ["start", "loaded", "first_step"]
    result = CliRunner().invoke(main, ["runs", "history", str(run), "--json"])
    assert result.exit_code == 0, result.output
    (first,) = json.loads(result.output)["attempts"]
    assert first["world_size"] == 4 and "preempted" in first["why"], first
    assert_loss_spike_report(records)


def assert_loss_spike_report(records: list[dict]) -> None:
    """The spike's record names the last rank; its report has every rank's loss of the step (the first stage's
    none) and the batches each rank that saw the spike read, one fingerprint per micro-batch, the same batch on every
    rank (DP 1). Rank 2 logs its own loss, a tenth of its TP peer's (the drill spikes one rank; TP peers' losses are
    equal in a real run), so it raises no alert and writes no batches of its own."""
    (spiked,) = [r for r in records if r.get("event") == metricslog.EVENT_LOSS_SPIKE]
    assert spiked["step"] == SPIKE_AT and spiked["highest_rank"] == SPIKE_RANK, spiked
    losses = spiked["losses"]
    assert losses[:2] == [None, None] and losses[3] == pytest.approx(10 * losses[2], rel=1e-3), losses
    where = Path(spiked["report"])
    assert json.loads((where / "report.json").read_text())["steps"][-1]["highest_ranks"] == [3, 2]
    prints = {p.name: json.loads(p.read_text())[str(SPIKE_AT)] for p in where.glob("batches-rank-*.json")}
    assert "batches-rank-3.json" in prints, sorted(prints)
    assert all(len(b["sha256"]) == 64 and b["tokens"] > 0 for found in prints.values() for b in found)
    assert len({json.dumps(found) for found in prints.values()}) == 1, prints  # one replica: the same batches
