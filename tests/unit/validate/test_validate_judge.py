"""The dry run's judging and phase reports, on synthetic metrics files and checkpoint directories (no processes).

The dry run reads what train.py did from its structured records in metrics.jsonl and decides where a restart must
resume with the runtime contract's own rule; these tests pin both: the expected resume step is the checkpoint
``checkpointdirs.latest_complete_checkpoint`` (train.py's ``--resume auto``) picks, incomplete checkpoints of every kind
included, and each judging rule passes a good attempt and fails the one breakage it exists for.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from recipekit.runtime.boundary import filenames, metricslog
from recipekit.runtime.boundary.resume import checkpointdirs
from recipekit.validate.dryrun.cluster.attemptlog import Attempt, MetricsTail, Step
from recipekit.validate.dryrun.cluster.startup import PhaseReporter, announcement, describe, workers
from recipekit.validate.dryrun.judges import training
from recipekit.validate.shared.results import Result, Status


# ------------------------------------------------------------------------------------------------- checkpoints
def safetensors(path: Path, *, truncate: int = 0) -> None:
    """A real safetensors file (header + one 2-float tensor), optionally missing its last ``truncate`` bytes."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    data = len(header).to_bytes(8, "little") + header + b"\x00" * 8
    path.write_bytes(data[: len(data) - truncate])


def checkpoint(output: Path, step: int, layout: str) -> Path:
    """checkpoint-<step> with the Trainer's state and weights in ``layout``."""
    path = output / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / filenames.TRAINER_STATE_FILE).write_text(json.dumps({"global_step": step}))
    if layout == "safetensors":
        safetensors(path / "model.safetensors")
    elif layout == "truncated-safetensors":
        safetensors(path / "model.safetensors", truncate=3)
    elif layout in ("bin-index", "bin-index-missing-shard"):
        shards = ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]
        index = {"metadata": {}, "weight_map": {"a": shards[0], "b": shards[1]}}
        (path / "pytorch_model.bin.index.json").write_text(json.dumps(index))
        for shard in shards[: 1 if layout == "bin-index-missing-shard" else 2]:
            (path / shard).write_bytes(b"weights")
    elif layout == "marked-incomplete":
        safetensors(path / "model.safetensors")
        (path / filenames.INCOMPLETE_MARKER).write_text("")
    elif layout == "no-trainer-state":
        safetensors(path / "model.safetensors")
        (path / filenames.TRAINER_STATE_FILE).unlink()
    else:
        raise AssertionError(layout)
    return path


@pytest.mark.parametrize(
    "layouts, expected",
    [
        ({2: "safetensors", 4: "bin-index", 6: "truncated-safetensors", 8: "bin-index-missing-shard"}, 4),
        ({4: "safetensors", 6: "truncated-safetensors"}, 4),
        ({4: "safetensors", 6: "bin-index-missing-shard"}, 4),
        ({4: "bin-index", 6: "marked-incomplete", 7: "no-trainer-state"}, 4),
        ({6: "truncated-safetensors"}, None),
        ({}, None),
        ({2: "safetensors", 10: "safetensors"}, 10),  # numerically newest, not by name
    ],
    ids=["mixed", "truncated-safetensors", "bin-missing-shard", "interrupted-saves", "none-complete", "empty", "order"],
)
def test_expected_resume_step_is_the_checkpoint_the_runtime_picks(
    tmp_path: Path, layouts: dict[int, str], expected: int | None
) -> None:
    for step, layout in layouts.items():
        checkpoint(tmp_path, step, layout)
    picked = checkpointdirs.latest_complete_checkpoint(tmp_path)
    assert training.expected_resume_step(tmp_path) == expected
    assert (checkpointdirs.checkpoint_step(picked) if picked else None) == expected  # the same answer train.py gets
    complete = [step for step, layout in sorted(layouts.items()) if layout in ("safetensors", "bin-index")]
    assert training.complete_checkpoints(tmp_path) == complete


# ------------------------------------------------------------------------------------------------- the records
def record_file(path: Path, records: list[dict]) -> None:
    for record in records:
        metricslog.append_record(path, record)


def observed(path: Path, number: int = 0, started: float = 100.0) -> Attempt:
    """An attempt that saw every record of ``path`` (steps one second apart after ``started``)."""
    attempt = Attempt(number, 29500, started)
    for i, record in enumerate(MetricsTail(path).read()):
        attempt.observe(record, started + 1 + i)
    return attempt


def test_metrics_tail_keeps_records_apart_from_steps_and_waits_for_whole_lines(tmp_path: Path) -> None:
    metrics = tmp_path / filenames.METRICS_FILE
    tail = MetricsTail(metrics)
    assert tail.read() == []  # no file yet
    start = metricslog.event(metricslog.EVENT_START, world_size=2, resume_from=None, resume_step=None)
    record_file(metrics, [start, {"step": 1, "loss": 2.5}])
    with metrics.open("a") as handle:
        handle.write('{"step": 2, "lo')  # rank 0 is mid-write
    attempt = Attempt(0, 1, 0.0)
    for record in tail.read():
        attempt.observe(record, 1.0)
    assert [s.step for s in attempt.steps] == [1] and attempt.last(metricslog.EVENT_START) == start
    with metrics.open("a") as handle:
        handle.write('ss": 2.25}\nnot json\n')
    record_file(
        metrics, [metricslog.event(metricslog.EVENT_DONE, step=2, output="/out"), {"step": 2, "train_runtime": 3}]
    )
    for record in tail.read():
        attempt.observe(record, 2.0)
    assert [(s.step, s.loss) for s in attempt.steps] == [(1, 2.5), (2, 2.25)]  # a done record has a step: no step
    assert [r["event"] for r in attempt.records] == ["start", "done"]


def test_judge_start_needs_the_record_at_the_planned_world_size(tmp_path: Path) -> None:
    metrics = tmp_path / filenames.METRICS_FILE
    result = Result("dryrun.train", "t")
    assert training.judge_start(result, observed(metrics), 2) is None
    assert result.failed and "wrote no 'start' record" in result.findings[0].message

    record_file(metrics, [metricslog.event(metricslog.EVENT_START, world_size=1, resume_from=None, resume_step=None)])
    result = Result("dryrun.train", "t")
    training.judge_start(result, observed(metrics), 2)
    assert result.failed and "world size 1, but the work copy plans 2" in result.findings[0].message

    result = Result("dryrun.train", "t")
    training.judge_start(result, observed(metrics), 1)
    assert not result.failed


def test_first_attempt_details_come_from_the_records(tmp_path: Path) -> None:
    metrics = tmp_path / filenames.METRICS_FILE
    start = metricslog.event(
        metricslog.EVENT_START, world_size=2, device="cpu", precision="bf16", resume_from=None, resume_step=None
    )
    adapted = [metricslog.event(metricslog.EVENT_ADAPTED, note=note) for note in ("optim → adamw_torch", "no tf32")]
    record_file(metrics, [start, *adapted, {"step": 1, "loss": 3.0}, {"step": 3, "loss": 2.0}])
    details = training.first_attempt_details(observed(metrics), pods=2)
    assert details["started"]["world_size"] == 2 and "event" not in details["started"]
    assert details["adapted_by_train_py"] == ["optim → adamw_torch", "no tf32"]
    assert details["first_loss"] == 3.0 and details["steps_per_s"] == 2.0  # steps 1 → 3 in one second
    assert details["time_to_first_step_s"] == 4.0  # the fourth record, started + 4


# ------------------------------------------------------------------------------------------------- completion
def finished_output(output: Path, steps: int = 8) -> None:
    checkpoint(output, 4, "safetensors")
    checkpoint(output, steps, "safetensors")
    safetensors(output / "model.safetensors")
    (output / filenames.TRAINER_STATE_FILE).write_text(json.dumps({"global_step": steps}))


EXPECT = training.Expectation(steps=8, save_steps=4, world_size=2)


def completed(tmp_path: Path, losses: list[float], done_step: int | None = 8) -> Attempt:
    metrics = tmp_path / "metrics" / filenames.METRICS_FILE
    metrics.parent.mkdir(exist_ok=True)
    records: list[dict] = [{"step": i + 1, "loss": loss} for i, loss in enumerate(losses)]
    if done_step is not None:
        records.append(metricslog.event(metricslog.EVENT_DONE, step=done_step, output=str(tmp_path)))
    record_file(metrics, records)
    attempt = observed(metrics)
    attempt.outcome, attempt.exit_codes = "completed", {0: 0, 1: 0}
    return attempt


def test_judge_completion_passes_a_finished_run(tmp_path: Path) -> None:
    finished_output(tmp_path)
    losses = [3.0 - 0.1 * i for i in range(8)]
    train = Result("dryrun.train", "t", details={"first_loss": 3.0, "time_to_first_step_s": 1, "steps_per_s": 1})
    training.judge_completion(train, completed(tmp_path, losses), losses, tmp_path, EXPECT)
    assert train.status is Status.PASS, [str(f) for f in train.findings]
    assert train.details["checkpoints"] == [4, 8] and train.details["final_weights"] == ["model.safetensors"]
    assert train.details["done"] == {"step": 8, "output": str(tmp_path)}
    assert "8 steps;" in train.reason and "checkpoints [4, 8]" in train.reason


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("no-done", "wrote no 'done' record"),
        ("done-early", "done.step"),
        ("nan-loss", "losses not all finite"),
        ("short-run", "final global_step 6, expected 8"),
        ("truncated-final-checkpoint", "no complete checkpoint-8"),
        ("no-midway-checkpoint", "no complete checkpoint-4"),
        ("no-final-weights", "no model weights"),
    ],
)
def test_judge_completion_catches(tmp_path: Path, breakage: str, message: str) -> None:
    output = tmp_path / "out"
    finished_output(output)
    losses = [3.0 - 0.1 * i for i in range(8)]
    done_step: int | None = 8
    if breakage == "no-done":
        done_step = None
    elif breakage == "done-early":
        done_step = 7
    elif breakage == "nan-loss":
        losses[3] = math.nan
    elif breakage == "short-run":
        (output / filenames.TRAINER_STATE_FILE).write_text(json.dumps({"global_step": 6}))
    elif breakage == "truncated-final-checkpoint":
        safetensors(output / "checkpoint-8" / "model.safetensors", truncate=1)
    elif breakage == "no-midway-checkpoint":
        (output / "checkpoint-4" / filenames.INCOMPLETE_MARKER).write_text("")
    elif breakage == "no-final-weights":
        (output / "model.safetensors").unlink()
    train = Result("dryrun.train", "t")
    training.judge_completion(train, completed(tmp_path, losses, done_step), losses, output, EXPECT)
    assert train.failed and any(message in str(f) for f in train.findings), [str(f) for f in train.findings]


# ----------------------------------------------------------------------------------------------------- resume
def killed_attempt(losses: dict[int, float]) -> Attempt:
    first = Attempt(0, 29500, 10.0, steps=[Step(s, loss, 10.0 + s) for s, loss in losses.items()])
    first.outcome, first.killed_pod, first.killed_at, first.killed_step = "killed", 1, 17.0, max(losses)
    first.killed_processes, first.exit_codes = 2, {0: -15, 1: -9}
    return first


def restarted(tmp_path: Path, start: dict | None, losses: dict[int, float], outcome: str = "completed") -> Attempt:
    metrics = tmp_path / "restart" / filenames.METRICS_FILE
    metrics.parent.mkdir(exist_ok=True)
    record_file(metrics, ([start] if start else []) + [{"step": s, "loss": v} for s, v in losses.items()])
    second = observed(metrics, number=1, started=20.0)
    second.outcome, second.exit_codes = outcome, {0: 0, 1: 0}
    return second


def start_at(output: Path, step: int | None, with_step: bool = True) -> dict:
    where = str(output / f"checkpoint-{step}") if step is not None else None
    return metricslog.event(
        metricslog.EVENT_START, world_size=2, resume_from=where, resume_step=step if with_step else None
    )


def test_judge_resume_passes_a_resume_from_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    checkpoint(tmp_path, 4, "safetensors")
    checkpoint(tmp_path, 6, "truncated-safetensors")  # the kill cut the save short: not a resume point
    expected = training.expected_resume_step(tmp_path)
    first = killed_attempt({1: 3.0, 2: 2.9, 3: 2.8, 4: 2.7, 5: 2.6, 6: 2.5})
    second = restarted(tmp_path, start_at(tmp_path, 4), {5: 2.6, 6: 2.5, 7: 2.4, 8: 2.3})
    resume = Result("dryrun.resume", "r")
    training.judge_resume(resume, first, second, training.complete_checkpoints(tmp_path), expected)
    assert resume.status is Status.PASS, [str(f) for f in resume.findings]
    d = resume.details
    assert d["expected_resume_step"] == 4 and d["resumed_step"] == 4 and d["complete_checkpoints_at_restart"] == [4]
    assert d["first_step_after_restart"] == 5 and d["replayed_steps"] == [5, 6]
    assert d["replayed_loss_max_abs_diff"] == 0.0 and d["teardown_s"] == 3.0
    assert d["mttr_s"] == 5.0  # killed at 17; the restart started at 20 and saw step 5 at 22 (after the start record)
    assert d["survivor_exit_codes"] == {0: -15}
    assert "resumed from checkpoint-4" in resume.reason and "replayed steps' loss differs by" in resume.reason


def test_judge_resume_reads_the_step_from_resume_from_when_the_record_has_no_step(tmp_path: Path) -> None:
    checkpoint(tmp_path, 4, "bin-index")
    first = killed_attempt({4: 2.7, 5: 2.6})
    second = restarted(tmp_path, start_at(tmp_path, 4, with_step=False), {5: 2.6, 6: 2.5})
    resume = Result("dryrun.resume", "r")
    training.judge_resume(resume, first, second, [4], training.expected_resume_step(tmp_path))
    assert resume.status is Status.PASS and resume.details["resumed_step"] == 4


@pytest.mark.parametrize(
    "case, message",
    [
        ("older-checkpoint", "but the newest complete checkpoint at the restart was checkpoint-4"),
        ("incomplete-checkpoint", "but the newest complete checkpoint at the restart was checkpoint-4"),
        ("from-scratch", "resumed from scratch"),
        ("no-start-record", "wrote no 'start' record"),
        ("skipped-steps", "the first step after the restart is 7, expected 5"),
        ("restart-failed", "the restarted job failed"),
    ],
)
def test_judge_resume_catches(tmp_path: Path, case: str, message: str) -> None:
    checkpoint(tmp_path, 2, "safetensors")
    checkpoint(tmp_path, 4, "safetensors")
    checkpoint(tmp_path, 6, "bin-index-missing-shard")
    expected = training.expected_resume_step(tmp_path)
    assert expected == 4
    first = killed_attempt({s: 3.0 - s / 10 for s in range(1, 7)})
    start, steps, outcome = start_at(tmp_path, 4), {s: 3.0 - s / 10 for s in range(5, 9)}, "completed"
    if case == "older-checkpoint":
        start, steps = start_at(tmp_path, 2), {s: 3.0 - s / 10 for s in range(3, 9)}
    elif case == "incomplete-checkpoint":  # train.py took the save the kill cut short
        start, steps = start_at(tmp_path, 6), {7: 2.3, 8: 2.2}
    elif case == "from-scratch":
        start, steps = start_at(tmp_path, None), {s: 3.0 - s / 10 for s in range(1, 9)}
    elif case == "no-start-record":
        start = None
    elif case == "skipped-steps":
        steps = {7: 2.3, 8: 2.2}
    elif case == "restart-failed":
        outcome = "failed"
    resume = Result("dryrun.resume", "r")
    training.judge_resume(resume, first, restarted(tmp_path, start, steps, outcome), [2, 4], expected)
    assert resume.failed and any(message in str(f) for f in resume.findings), [str(f) for f in resume.findings]


# ----------------------------------------------------------------------------------------------------- phases
def test_announcements_are_the_runtime_speaking_in_its_own_name() -> None:
    assert announcement("launch: pod 1/2 of job; master 127.0.0.1:1; 1 processes per pod") is not None
    assert announcement(" 12%|█▎ | 1/8\rtrain.py: failed: ValueError: x") == "train.py: failed: ValueError: x"
    assert announcement("run.sh: no CANN environment script found") is not None
    assert announcement("2026 INFO [rank 0] train: world size 2") is None  # a log line: not a phase
    assert announcement("Generating train split: 128 examples") is None
    long = announcement("train.py: failed: RuntimeError: " + "x" * 500) or ""
    assert len(long) <= 200 and long.endswith(" …")  # the whole message is in the pod's log
    words = announcement("train.py: failed: DistBackendError: " + "Connection closed by peer " * 20) or ""
    assert len(words) <= 200 and words.endswith(" …")
    assert words[:-2].split()[-1] in ("Connection", "closed", "by", "peer"), "never cut mid-word"


def test_after_a_kill_on_purpose_the_other_pods_errors_are_one_plain_line(tmp_path: Path) -> None:
    """The expected kill printed the surviving pod's raw gloo error, cut mid-word: now one plain line per pod."""
    logs = {i: tmp_path / f"pod-{i}.log" for i in (0, 1)}
    for path in logs.values():
        path.write_text("")
    said: list[str] = []
    phases = PhaseReporter(0, {i: (p, 0) for i, p in logs.items()}, "runtime.train", 1, lambda i: [], said.append)
    phases.expected = (1, "pod 1 was killed")
    gloo = "train.py: failed: DistBackendError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed"
    logs[0].write_text(gloo + " by peer [127.0.0.1]:12345\nlaunch: torchrun exited 1; the pod exits 1 (failed)\n")
    phases.poll()
    assert said == [
        "attempt 0: pod 0: stopped, as expected once pod 1 was killed (its peers' collectives fail); the error is "
        "in pod-0.log"
    ]


def test_workers_counts_torchrun_children_running_the_module_not_torchrun() -> None:
    torchrun = ["/venv/bin/python", "/venv/bin/torchrun", "--nnodes=2", "-m", "runtime.train", "--recipe", "r"]
    worker = ["/venv/bin/python", "-u", "-m", "runtime.train", "--recipe", "r"]
    assert workers([torchrun], "runtime.train") == 0
    assert workers([["bash", "run.sh"], torchrun, worker, worker], "runtime.train") == 2
    assert workers([worker], "other.module") == 0


def test_describe_gives_one_line_per_record_kind() -> None:
    phase = metricslog.event(metricslog.EVENT_PHASE, phase="load data", rank=0, rows=128)
    assert describe(phase) == "train.py rank 0: load data (rows 128)"
    start = metricslog.event(
        metricslog.EVENT_START,
        world_size=2,
        device="cpu",
        precision="bf16",
        zero_stage=2,
        parameters_total=2000,
        parameters_trainable=1000,
        resume_from="/out/checkpoint-4",
        resume_step=4,
    )
    assert describe(start) == (
        "train.py started: world size 2, cpu, bf16, ZeRO 2, 1,000 of 2,000 parameters trainable; "
        "resuming from /out/checkpoint-4"
    )
    assert describe(metricslog.event(metricslog.EVENT_ADAPTED, note="x")) == "train.py adapted: x"
    assert "step 6" in (describe(metricslog.event(metricslog.EVENT_PREEMPTED, step=6)) or "")
    assert (
        describe(metricslog.event(metricslog.EVENT_DONE, step=8, output="/o")) == "train.py done at step 8; model in /o"
    )
    assert describe({"event": "unknown"}) is None


def test_phase_reporter_says_each_phase_once_per_pod(tmp_path: Path) -> None:
    logs = {i: tmp_path / f"pod-{i}.log" for i in range(2)}
    logs[0].write_text("attempt 0 output of an earlier attempt\nlaunch: pod 0/2 of old\n")
    offset = logs[0].stat().st_size
    logs[1].write_text("")
    trees: dict[int, list[list[str]]] = {0: [["bash", "run.sh"]], 1: []}
    said: list[str] = []
    reporter = PhaseReporter(1, {0: (logs[0], offset), 1: (logs[1], 0)}, "runtime.train", 1, trees.get, said.append)
    reporter.poll()
    assert said == []  # nothing new yet: the earlier attempt's lines are not this attempt's
    with logs[0].open("a") as log:
        log.write("launch: pod 0/2 of job; master 127.0.0.1:5; 1 processes per pod\nnoise\nlaunch: pod 0/2 of j")
    trees[0] = [["python", "/bin/torchrun", "-m", "runtime.train"], ["python", "-u", "-m", "runtime.train"]]
    reporter.poll()
    reporter.poll()
    reporter.record(metricslog.event(metricslog.EVENT_PHASE, phase="build model", rank=0))
    reporter.record({"step": 1, "loss": 2.0})  # not a record kind that is described
    assert said == [
        "attempt 1: pod 0: launch: pod 0/2 of job; master 127.0.0.1:5; 1 processes per pod",
        "attempt 1: pod 0: torchrun started 1 worker process(es)",
        "attempt 1: train.py rank 0: build model",
    ]


def test_the_operations_records_are_shown_as_phases() -> None:
    from recipekit.validate.dryrun.cluster.startup import describe

    preflight = {
        "event": "preflight",
        "ok": False,
        "checks": [{"check": "devices", "status": "fail"}],
        "seconds": 1.5,
        "reason": "devices: pod 1 sees 3",
    }
    assert describe(preflight) == "train.py preflight FAILED: devices: pod 1 sees 3 (devices fail; 1.5 s)"
    stalled = {"event": "stalled", "rank": 1, "waited_s": 30.1, "phase": "step 6", "stacks": "/o/hang/x.txt"}
    assert describe(stalled) == "train.py rank 1: watchdog fired after 30.1 s in step 6; stacks in /o/hang/x.txt"
    assert describe({"event": "alert", "alert": "mfu_low", "message": "m"}) == "train.py alert mfu_low: m"
    assert describe({"event": "checkpoint", "step": 4}) is None


def test_a_failed_pods_tail_keeps_the_workers_last_words_not_torchruns_traceback() -> None:
    """torchrun's own traceback (only "a worker failed") is dropped from a pod's tail; the worker's abort message
    before it and the root-cause box after it stay."""
    from recipekit.validate.dryrun.cluster.pods import without_launcher_traceback

    agent = ["Traceback (most recent call last):"] + [f'  File "torch/distributed/run.py", line {i}' for i in range(40)]
    lines = [
        "step 8/8",
        "terminate called after throwing an instance of 'gloo::IoException'",
        *agent,
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "  exitcode  : -6 (pid: 31076)  (SIGABRT)",
    ]
    kept = without_launcher_traceback(lines)
    assert kept[-4:] == [lines[0], lines[1], lines[-2], lines[-1]] and len(kept) == 4
    assert without_launcher_traceback(lines[:2]) == lines[:2]  # nothing of torchrun's: unchanged


def _scraping_run(pods: int, save_steps: int):
    """A dry run as far as its endpoint reads need (no pods, no work copy): ``pods`` serving pods, the midway save
    at ``save_steps``, no hot tier. The tests replace ``attempts.scrape_pods`` with what the endpoints answer."""
    from types import SimpleNamespace

    from recipekit.validate.dryrun.cluster import attempts

    run = object.__new__(attempts.DryRun)
    run.metrics_ports, run.serving_pods, run.drained = [9100 + pod for pod in range(pods)], list(range(pods)), set()
    run.options = SimpleNamespace(save_steps=save_steps)
    run.work = SimpleNamespace(hot_tier="none")
    return run


def test_a_restarted_attempt_is_scraped_only_after_its_own_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gauge lives in its process: a restart resumed at step 4 serves no checkpoint time and no jump ratio at its
    first step 5, so the endpoints are read once that attempt has checkpointed, not at any step past save_steps."""
    from recipekit.validate.dryrun.cluster import attempts

    monkeypatch.setattr(attempts, "scrape_pods", lambda ports: {"error": None, "pods": {}})
    run = _scraping_run(pods=1, save_steps=4)
    restarted = Attempt(1, 29501, 0.0)
    run._scrape(restarted, 5)
    assert restarted.scraped is None
    restarted.observe({"event": metricslog.EVENT_CHECKPOINT, "step": 8}, 1.0)
    run._scrape(restarted, 9)
    assert restarted.scraped == {"error": None, "pods": {}, "step": 9, "settled": False}  # its last save: kept


def test_a_read_at_rank_0s_checkpoint_record_is_read_again_after_the_next_step(monkeypatch) -> None:
    """Rank 0 writes the checkpoint record when its own save is over; another rank times its save a moment later, so
    the read at the record is provisional, and the one once rank 0 logged the next step (whose collectives waited
    for every rank past its save) is the one judged. A full run caught pod 1 read without its checkpoint gauge."""
    from recipekit.validate.dryrun.cluster import attempts

    reads: list[int] = []
    monkeypatch.setattr(attempts, "scrape_pods", lambda ports: {"error": None, "pods": {}, "read": reads.append(1)})
    run = _scraping_run(pods=2, save_steps=4)
    first = Attempt(0, 29501, 0.0)
    for step in (1, 2, 3, 4):
        first.observe({"step": step, "loss": 1.0}, 0.0)
    first.observe({"event": metricslog.EVENT_CHECKPOINT, "step": 4}, 1.0)
    run._scrape(first, 5)  # at the record
    assert first.scraped is not None and first.scraped["settled"] is False and len(reads) == 1
    first.observe({"step": 5, "loss": 1.0}, 2.0)
    run._scrape(first, 5)  # at the next step's record
    assert first.scraped["settled"] is True and first.scraped["step"] == 5 and len(reads) == 2
    first.observe({"step": 6, "loss": 1.0}, 3.0)
    run._scrape(first, 6)
    assert len(reads) == 2  # settled: not read again


def _endpoint(port: int, without: tuple[str, ...] = ()) -> dict:
    from recipekit.validate.dryrun.cluster.scrape import expected_metric_names

    declared, sampled = expected_metric_names()
    return {"port": port, "declared": declared, "sampled": [n for n in sampled if n not in without], "error": None}


def test_a_read_at_the_last_save_is_read_again_at_each_look_until_every_pod_has_its_values(monkeypatch) -> None:
    """A restarted attempt's only save is its last: no step follows it, and the full run caught pod 1 read before
    its rank timed that save (a Megatron dry run: "pod 1 served without a value at step 7"). The dry run reads again
    at its next look, and a read with every value on every pod is settled."""
    from recipekit.runtime.boundary import metricnames
    from recipekit.validate.dryrun.cluster import attempts

    late = (metricnames.CHECKPOINT_SECONDS.name,)
    answers = iter([{0: _endpoint(9100), 1: _endpoint(9101, without=late)}, {0: _endpoint(9100), 1: _endpoint(9101)}])
    monkeypatch.setattr(attempts, "scrape_pods", lambda ports: {"error": None, "pods": next(answers)})
    run = _scraping_run(pods=2, save_steps=3)
    restarted = Attempt(1, 29501, 0.0)
    for step in (4, 5, 6):
        restarted.observe({"step": step, "loss": 1.0}, 0.0)
    restarted.observe({"event": metricslog.EVENT_CHECKPOINT, "step": 6}, 1.0)
    run._scrape(restarted, 7)  # at the record
    assert restarted.scraped is not None and restarted.scraped["settled"] is False
    run._settle(restarted)  # the next look
    assert restarted.scraped["settled"] is True and late[0] in restarted.scraped["pods"][1]["sampled"]
    run._settle(restarted)  # settled: not read again (a third read would exhaust the answers and raise)


def test_the_metrics_judge_takes_a_settled_read_over_an_earlier_unsettled_one() -> None:
    """An attempt killed right after its save may keep only a provisional read; a later attempt's settled read is
    the one that says what every pod serves."""
    from recipekit.runtime.boundary import metricnames
    from recipekit.validate.dryrun.judges.operations import judge_metrics
    from recipekit.validate.shared.results import Result

    late = (metricnames.CHECKPOINT_SECONDS.name,)
    killed, restarted = Attempt(0, 29501, 0.0), Attempt(1, 29502, 0.0)
    killed.scraped = {"error": None, "pods": {0: _endpoint(1), 1: _endpoint(2, late)}, "step": 5, "settled": False}
    restarted.scraped = {"error": None, "pods": {0: _endpoint(1), 1: _endpoint(2)}, "step": 7, "settled": True}
    result = Result("dryrun.metrics", "metrics")
    judge_metrics(result, [killed, restarted])
    assert not result.failed and "at step 7" in result.reason
    result = Result("dryrun.metrics", "metrics")
    judge_metrics(result, [killed])
    assert result.failed and "pod 1 served without a value at step 5" in str(result.findings[0])
