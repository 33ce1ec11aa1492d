"""The operations contract in the Megatron room, wired at Bridge's callback events (runtime/megatron/ops.py and
callbacks.py), driven here by fakes of Bridge's events on one process: what each event leaves behind (metrics.jsonl
with the shared throughput figures, preflight's report, recovery.jsonl and the progress file that `runs history`
reads, the watchdog's phases), the loss guard stopping before Bridge saves a poisoned step, and the fault drill's
poisoned forward step. Bridge's own loop runs these events in tests/integration/test_megatron_ops_run.py.

Bridge is not installed in the dev venv: the callback module's one import of it (``Callback``) is stood in for.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import sys
import time
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

torch = pytest.importorskip("torch")

from recipekit.runtime.boundary import exitcodes, filenames, flopcount, metricslog  # noqa: E402
from recipekit.runtime.megatron.checkpoints import Layout  # noqa: E402
from recipekit.runtime.megatron.ops import BridgeOps, NonFiniteStop, step_function  # noqa: E402
from recipekit.runtime.megatron.settings import load_engine_run  # noqa: E402
from recipekit.runtime.ops.device import Device  # noqa: E402
from recipekit.runtime.volume import attemptends, recovery  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
TEMPLATE = ROOT / "tests" / "golden" / "bundles" / "tiny_sft" / "recipe.yaml"
DOCUMENT = ROOT / "tests" / "fixtures" / "megatron" / "document.yaml"
TOKENS_PER_STEP = 8 * 64  # the document's global batch × sequence length


def engine_run(tmp_path: Path, **operations: Any) -> Any:
    """A Megatron bundle's recipe.yaml (the tiny_sft preset's sections, the fixture's document) with its output in
    ``tmp_path``/run, no metrics port, and ``operations`` merged into recipe.yaml's operations section."""
    template = yaml.safe_load(TEMPLATE.read_text(encoding="utf-8"))
    document = yaml.safe_load(DOCUMENT.read_text(encoding="utf-8"))
    document["recipekit"]["output_dir"] = str(tmp_path / "run")
    ops = copy.deepcopy(template["operations"])
    ops["metrics"]["ports"] = []
    ops["preflight"]["allreduce_sizes_mb"] = [0.01]
    for section, values in operations.items():
        ops[section].update(values)
    text = {"recipe": template["recipe"], "plan": template["plan"], "operations": ops, "megatron": document}
    path = tmp_path / "bundle" / "recipe.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(text, sort_keys=False), encoding="utf-8")
    return load_engine_run(path)


class Records:
    writer = True

    def __init__(self, output_dir: Path):
        self.path = output_dir / filenames.METRICS_FILE

    def add(self, kind: str, **fields: Any) -> None:
        metricslog.append_record(self.path, metricslog.stamped(metricslog.event(kind, **fields)))


@pytest.fixture
def room(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """runtime/megatron/callbacks.py, imported with a stand-in for Bridge's ``Callback`` base class."""
    for name in ("megatron", "megatron.bridge", "megatron.bridge.training"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    bridge_callbacks = types.ModuleType("megatron.bridge.training.callbacks")
    bridge_callbacks.Callback = type("Callback", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "megatron.bridge.training.callbacks", bridge_callbacks)
    monkeypatch.delitem(sys.modules, "recipekit.runtime.megatron.callbacks", raising=False)
    import recipekit.runtime.megatron.callbacks as callbacks

    return callbacks


def context(step: int, loss: float | None = None) -> SimpleNamespace:
    """Bridge's CallbackContext at ``step`` completed steps (a loss only on the last pipeline stage)."""
    return SimpleNamespace(
        state=SimpleNamespace(train_state=SimpleNamespace(step=step)),
        model=None,
        loss_dict={} if loss is None else {"lm loss": torch.tensor(loss)},
        grad_norm=None if loss is None else 0.5,
        optimizer=SimpleNamespace(param_groups=[{"lr": 1e-3}]),
    )


def start(room: Any, run: Any, resume: tuple[int | None, str | None] = (None, None)) -> tuple[Any, Any]:
    """One attempt's BridgeOps and the room's callback over it, on one CPU process."""
    output = run.output_dir
    output.mkdir(parents=True, exist_ok=True)
    ops = BridgeOps(run, Device("cpu", 0), 1, resume, Records(output))
    layout = Layout(run.plan.run_id, 1, {"tensor": 1}, 8)
    callback = room.RoomCallback(output, layout, None, run.plan.flops, TOKENS_PER_STEP, ops)
    return ops, callback


TOKENS_PER_MICRO_BATCH = 4


def last_stage_step(loss: float) -> Any:
    """Bridge's forward step on the last pipeline stage: it reads a micro-batch, its output is each token's loss
    (``loss`` each), its loss function Megatron's masked sum (``(summed loss, tokens, {"lm loss": [sum, tokens]})``)."""

    def loss_func(output_tensor: Any) -> Any:
        total = output_tensor.float().sum()
        tokens = torch.tensor(output_tensor.numel(), dtype=torch.int)
        return total, tokens, {"lm loss": torch.cat([total.view(1), tokens.float().view(1)])}

    def forward_step(state: Any, data_iterator: Any, model: Any, return_schedule_plan: bool = False) -> Any:
        if data_iterator is not None:
            next(data_iterator)
        return torch.full((TOKENS_PER_MICRO_BATCH,), loss), loss_func

    return forward_step


def train_step(ops: Any, completed: int, loss: float, batches: list[Any] | None = None) -> float:
    """One micro-batch through the room's step function and the loss function it returns, as Bridge's schedule
    runs them; the loss Bridge then logs (the report's sum over its tokens)."""
    run = step_function(last_stage_step(loss), ops)
    batch_iterator = iter(batches) if batches is not None else None  # None: a stage that reads no batch
    output, loss_func = run(SimpleNamespace(train_state=SimpleNamespace(step=completed)), batch_iterator, None)
    _, _, report = loss_func(output)
    total, tokens = report["lm loss"].tolist()
    return total / tokens


def steps(callback: Any, first: int, last: int, losses: dict[int, float] | None = None) -> None:
    """Bridge's events of steps ``first``..``last`` (Bridge's step counter is the steps completed before), each
    step's micro-batch through the room's step function between them."""
    for step in range(first, last + 1):
        callback.on_train_step_start(context(step - 1))
        logged = train_step(callback.ops, step - 1, (losses or {}).get(step, 3.0 - 0.1 * step))
        callback.on_train_step_end(context(step - 1, logged))


def test_a_run_leaves_the_trainers_operations_records(room: Any, tmp_path: Path) -> None:
    run = engine_run(tmp_path)
    ops, callback = start(room, run)
    callback.on_train_start(context(0))
    assert (run.output_dir / filenames.CLUSTER_CHECK_FILE).is_file()  # preflight ran before the first step
    assert ops.phases is not None and ops.phases.watchdog._phase == "the first step"
    steps(callback, 1, 4)
    ops.done(4)
    ops.close()

    records = metricslog.read_records(run.output_dir / filenames.METRICS_FILE)
    # the save after step 3 (save_interval 3), timed from the step's end to the next step's start (Bridge's save and
    # rank 0's signature: what training waited for), as the Trainer's checkpoint record
    assert [r["event"] for r in records if "event" in r] == [metricslog.EVENT_PREFLIGHT, metricslog.EVENT_CHECKPOINT]
    (saved,) = [r for r in records if r.get("event") == metricslog.EVENT_CHECKPOINT]
    assert saved["step"] == 3 and saved["seconds"] >= 0 and saved["bytes"] == 0  # nothing written by the stand-in
    lines = [r for r in records if "step" in r and "loss" in r]
    assert [r["step"] for r in lines] == [1, 2, 3, 4] and lines[0]["loss"] == pytest.approx(2.9)
    line = lines[-1]
    assert line["step_time_s"] >= 0 and line["grad_norm"] == 0.5 and line["learning_rate"] == 1e-3
    assert line["dataloader_wait_fraction"] == 0.0  # the stand-in's steps read no batch
    # the throughput figures are flopcount.step_figures' over the step's tokens, as the Trainer's
    flops = run.plan.flops
    expected = flopcount.step_figures(
        line["tokens_per_second_per_device"], flops.model_per_token, flops.hardware_per_token, flops.peak_tflops
    )
    assert line["mfu"] == pytest.approx(expected["mfu"], rel=1e-3) and line["mfu"] > 0

    events = [r["event"] for r in recovery.read(run.output_dir)]
    assert events == ["start", "loaded", "first_step", "done"]
    progress = json.loads((run.output_dir / recovery.PROGRESS_FILE).read_text())
    assert progress["step"] == 4 and progress["done"] is True


def test_the_watchdog_gets_the_steady_timeout_for_a_save_and_the_stall_one_for_a_step(room, tmp_path) -> None:
    run = engine_run(tmp_path, watchdog={"stall_timeout_s": 300, "steady_timeout_s": 1200})
    ops, callback = start(room, run)
    callback.on_train_start(context(0))
    assert ops.phases is not None
    watchdog = ops.phases.watchdog
    steps(callback, 1, 2)
    assert (watchdog._phase, watchdog._timeout) == ("step 3", 300.0)
    steps(callback, 3, 3)  # the document saves every 3 steps: Bridge saves after this event
    assert (watchdog._phase, watchdog._timeout) == ("the checkpoint save after step 3", 1200.0)
    callback.on_train_step_start(context(3))  # the save is over: step 4 begins
    assert watchdog._phase == "step 4"
    ops.close()
    assert watchdog._deadline is None


def test_a_nonfinite_loss_stops_before_bridge_saves_and_exits_nonfinite(room, tmp_path) -> None:
    run = engine_run(tmp_path)
    ops, callback = start(room, run)
    callback.on_train_start(context(0))
    signed = run.output_dir / "checkpoints" / "iter_0000001"
    signed.mkdir(parents=True)
    (signed / filenames.RUN_FILE).write_text("{}")
    with pytest.raises(NonFiniteStop):
        steps(callback, 1, 2, {2: math.nan})
    code = ops.stopped(Records(run.output_dir))
    ops.close()
    assert code == exitcodes.EXIT_NONFINITE
    report = json.loads((run.output_dir / f"{filenames.NONFINITE_PREFIX}2" / "report.json").read_text())
    assert report["step"] == 2 and report["ranks"] == [0] and report["last_good_checkpoint"] == str(signed)
    assert [r["step"] for r in report["recent_logs"]] == [1, 2]
    records = metricslog.read_records(run.output_dir / filenames.METRICS_FILE)
    stop = [r for r in records if r.get("event") == metricslog.EVENT_NONFINITE]
    assert len(stop) == 1 and stop[0]["action"] == "TerminateJob" and stop[0]["step"] == 2
    # the progress stayed at the last good step: the step that went wrong is never counted as done
    assert json.loads((run.output_dir / recovery.PROGRESS_FILE).read_text())["step"] == 1


def test_under_warn_a_nonfinite_loss_is_an_alert_and_training_goes_on(room, tmp_path) -> None:
    run = engine_run(tmp_path, alerts={"nonfinite_loss": "warn"})
    ops, callback = start(room, run)
    callback.on_train_start(context(0))
    steps(callback, 1, 3, {2: math.inf})
    ops.close()
    alerts = [r for r in metricslog.read_records(run.output_dir / filenames.METRICS_FILE) if r.get("alert")]
    assert [(a["alert"], a["step"]) for a in alerts] == [("nonfinite_loss", 2)]


def test_a_rank_without_the_loss_still_joins_the_verdict(room, tmp_path, monkeypatch) -> None:
    """A first pipeline stage has no loss: it takes its verdict from the all-reduce, as every rank does."""
    run = engine_run(tmp_path)
    ops, callback = start(room, run)
    callback.on_train_start(context(0))
    assert ops.core is not None
    monkeypatch.setattr(ops.core.guard, "agree", lambda device, step: [3])  # rank 3 (the last stage) saw a NaN
    callback.on_train_step_start(context(0))
    with pytest.raises(NonFiniteStop):
        callback.on_train_step_end(context(0, None))
    assert ops.core.guard.stopped_at == 1 and ops.core.guard.ranks == [3]
    ops.close()


def test_a_restarted_attempt_is_a_recovery_runs_history_reads(room, tmp_path) -> None:
    from recipekit.cli import main

    run = engine_run(tmp_path)
    ops, callback = start(room, run)
    callback.on_train_start(context(0))
    steps(callback, 1, 4)
    ops.close()
    attemptends.record_end(exitcodes.EXIT_PREEMPTED, {"RANK": "0", "GROUP_RANK": "0"})  # SIGTERM after step 4
    checkpoint = str(run.output_dir / "checkpoints" / "iter_0000003")
    ops2, callback2 = start(room, run, resume=(3, checkpoint))
    callback2.on_train_start(context(3))
    steps(callback2, 4, 6)
    ops2.done(6)
    ops2.close()

    found = recovery.history(recovery.read(run.output_dir))
    assert len(found) == 1 and (found[0].interrupted_step, found[0].resume_step) == (4, 3)
    assert found[0].steps_lost == 1 and found[0].first_step == 4
    result = CliRunner().invoke(main, ["runs", "history", str(run.output_dir), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert len(document["recoveries"]) == 1 and document["steps_lost"] == 1
    assert "exit 143 preempted" in document["attempts"][0]["why"]


def test_the_step_function_times_the_wait_for_batches(room, tmp_path) -> None:
    """Bridge's loop reports no data wait: the room's step function times each ``next`` of its iterator, and the
    step's share is the gauge and the metrics line's ``dataloader_wait_fraction`` (the Trainer's figure)."""

    def slow() -> Any:
        while True:
            time.sleep(0.05)
            yield torch.ones(2)

    def forward_step(state: Any, data_iterator: Any, model: Any, return_schedule_plan: bool = False) -> Any:
        return next(data_iterator), "loss_func"

    run = engine_run(tmp_path)
    ops, callback = start(room, run)
    step = step_function(forward_step, ops)
    callback.on_train_start(context(0))
    callback.on_train_step_start(context(0))
    step(SimpleNamespace(train_state=SimpleNamespace(step=0)), slow(), None)
    assert ops.batch_wait_s >= 0.05
    callback.on_train_step_end(context(0, 2.0))
    ops.close()
    (line,) = [r for r in metricslog.read_records(run.output_dir / filenames.METRICS_FILE) if "loss" in r]
    assert 0 < line["dataloader_wait_fraction"] <= 1


def test_the_fault_drill_poisons_bridges_forward_step_at_its_step_only(room, tmp_path) -> None:
    def forward_step(state: Any, data_iterator: Any, model: Any, return_schedule_plan: bool = False) -> Any:
        return torch.ones(2), "loss_func"

    run = engine_run(tmp_path, testing={"nan_at_step": 2})
    ops, _ = start(room, run)
    assert step_function(forward_step, None) is forward_step
    step = step_function(forward_step, ops)
    assert inspect.signature(step) == inspect.signature(forward_step)  # Bridge reads it to call the step
    ops.train_started(0)
    clean, _ = step(SimpleNamespace(train_state=SimpleNamespace(step=0)), None, None)
    poisoned, loss_func = step(SimpleNamespace(train_state=SimpleNamespace(step=1)), None, None)
    ops.close()
    assert torch.isfinite(clean).all() and torch.isnan(poisoned).all() and loss_func.__wrapped__ == "loss_func"
    assert (run.output_dir / filenames.FAULTS_DIR / "nan-at-step-2").is_file()


def test_a_pod_preflight_stops_never_reaches_the_first_step(room, tmp_path) -> None:
    """What preflight raises at Bridge's on_train_start leaves ``pretrain()`` with its exit code, before any step."""
    from recipekit.runtime.boundary.common import RunError

    run = engine_run(tmp_path, testing={"user_error_pod": 0})
    ops, callback = start(room, run)
    with pytest.raises(RunError) as stopped:
        callback.on_train_start(context(0))
    ops.close()
    assert getattr(stopped.value, "code", None) == exitcodes.EXIT_USER_ERROR
    assert not (run.output_dir / recovery.RECOVERY_FILE).exists()  # no attempt began


def test_bridges_own_sigterm_handler_is_entered_when_the_document_asks_for_it(room) -> None:
    """Bridge 0.3.1 makes its DistributedSignalHandler but never enters it for training: the room does, at the
    loop's start, so a SIGTERM reaches Bridge's check after the step instead of killing the process unsaved."""
    entered: list[bool] = []
    handler = SimpleNamespace(__enter__=lambda: entered.append(True))
    asked = SimpleNamespace(
        cfg=SimpleNamespace(train=SimpleNamespace(exit_signal_handler=True)), signal_handler=handler
    )
    off = SimpleNamespace(cfg=SimpleNamespace(train=SimpleNamespace(exit_signal_handler=False)), signal_handler=handler)
    assert room.install_signal_handler(asked) and entered == [True]
    assert not room.install_signal_handler(off) and entered == [True]


def test_the_checkpoint_writers_queue_starts_with_sigterm_ignored(room, monkeypatch) -> None:
    """torchrun signals each worker's process group: the writer's spawned Manager must outlive that SIGTERM, so it
    starts with SIGTERM ignored (inherited by a spawned process); this process's handler is restored after."""
    import signal

    seen: list[Any] = []
    writer = types.ModuleType("megatron.core.dist_checkpointing.strategies.filesystem_async")
    writer._get_write_results_queue = lambda: seen.append(signal.getsignal(signal.SIGTERM))  # type: ignore[attr-defined]
    strategies = types.ModuleType("megatron.core.dist_checkpointing.strategies")
    strategies.filesystem_async = writer  # type: ignore[attr-defined]
    for name in ("megatron.core", "megatron.core.dist_checkpointing"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "megatron.core.dist_checkpointing.strategies", strategies)
    monkeypatch.setitem(sys.modules, writer.__name__, writer)
    before = signal.getsignal(signal.SIGTERM)
    assert room.shield_checkpoint_writer()
    assert seen == [signal.SIG_IGN] and signal.getsignal(signal.SIGTERM) == before
    del writer._get_write_results_queue  # type: ignore[attr-defined]
    assert not room.shield_checkpoint_writer()  # another megatron-core: nothing to shield, nothing changed


def test_each_signed_checkpoint_goes_to_the_cold_tier_and_a_finished_run_waits_for_the_last(room, tmp_path) -> None:
    """train.cold_checkpoints in the room, as in the Trainer: rank 0 hands each checkpoint it signed to the copier
    (the store gets ``iter_N`` with its run record), a failed copy is an alert and training goes on, and the run's
    end awaits the last copy."""
    run = engine_run(tmp_path)
    store = tmp_path / "cold"
    command = ["sh", "-c", f"test {{step}} != 3 && mkdir -p {store} && cp -r {{checkpoint}} {store}/{{name}}"]
    path = tmp_path / "bundle" / "recipe.yaml"
    text = yaml.safe_load(path.read_text(encoding="utf-8"))
    text["recipe"]["train"]["cold_checkpoints"] = {"command": command, "every": 1, "timeout_s": 60}
    path.write_text(yaml.safe_dump(text, sort_keys=False), encoding="utf-8")
    run = load_engine_run(path)
    ops, callback = start(room, run)
    assert ops.cold is not None
    callback.on_train_start(context(0))
    for step in (3, 6):
        saved = run.output_dir / "checkpoints" / f"iter_{step:07d}"
        saved.mkdir(parents=True)
        (saved / filenames.RUN_FILE).write_text(json.dumps({"step": step}))
        ops.signed(step)
        if step == 3:
            ops.cold.close()  # the copies run one at a time: step 3's has ended before step 6's is handed over
    ops.done(6)
    ops.close()
    copies = [
        r
        for r in metricslog.read_records(run.output_dir / filenames.METRICS_FILE)
        if r.get("event") == "checkpoint_cold"
    ]
    assert [(c["step"], c["code"]) for c in copies] == [(3, 1), (6, 0)]
    assert json.loads((store / "iter_0000006" / filenames.RUN_FILE).read_text())["step"] == 6
    alerts = [r for r in metricslog.read_records(run.output_dir / filenames.METRICS_FILE) if r.get("alert")]
    assert [(a["alert"], a["step"]) for a in alerts] == [("checkpoint_cold_failed", 3)]


def test_a_loss_spike_names_the_rank_and_its_batches_by_fingerprint(room, tmp_path) -> None:
    """The spike drill (ops.testing.spike_at_step) makes the last stage's loss of step 3 ten times, through the loss
    function the step function hands Bridge (the logged loss shows it): the alert's report holds the rank's own
    loss of the step over its label tokens, and the fingerprint of the micro-batch it read, as the Trainer's does."""
    from recipekit.runtime.ops.lossguard import batch_fingerprint

    run = engine_run(tmp_path, testing={"spike_at_step": 3, "spike_rank": 0})
    ops, callback = start(room, run)
    callback.on_train_start(context(0))
    tokens = {step: torch.arange(8).view(1, 8) + 100 * step for step in (1, 2, 3)}
    for step in (1, 2, 3):
        callback.on_train_step_start(context(step - 1))
        logged = train_step(ops, step - 1, 2.0, [{"tokens": tokens[step], "labels": None}])
        callback.on_train_step_end(context(step - 1, logged))
    ops.close()

    records = metricslog.read_records(run.output_dir / filenames.METRICS_FILE)
    assert [r["loss"] for r in records if "loss" in r] == [2.0, 2.0, 20.0]
    (spiked,) = metricslog.events(records, metricslog.EVENT_LOSS_SPIKE)
    assert spiked["step"] == 3 and spiked["highest_rank"] == 0
    assert spiked["losses"] == [20.0 * TOKENS_PER_MICRO_BATCH] and spiked["tokens"] == [TOKENS_PER_MICRO_BATCH]
    where = Path(spiked["report"])
    report = json.loads((where / "report.json").read_text())
    assert report["steps"][-1]["step"] == 3 and report["steps"][-1]["highest_ranks"] == [0]
    prints = json.loads((where / "batches-rank-0.json").read_text())
    assert prints == {"3": [batch_fingerprint(tokens[3])]}
