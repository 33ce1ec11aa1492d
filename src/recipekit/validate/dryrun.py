"""The dry run: the bundle's own run.sh and runtime, as N simulated Volcano pods on this machine.

The bundle is never written to: :mod:`recipekit.validate.workcopy` re-plans its recipe for this machine (tiny twin,
generated data, a few steps, pods × 1 process, the CPU) into a work directory and records every difference in
``substitutions.json``. This module builds DeepSpeed's C++ ops once, starts the pods and judges what they did.

Each pod is ``bash run.sh`` with what Volcano's env and svc plugins inject (``VC_TASK_INDEX``, ``VK_TASK_INDEX``,
``VC_<TASK>_HOSTS`` = 127.0.0.1 per pod, ``VC_<TASK>_NUM``). With ``--kill-pod I --at-step S``, pod I's whole process
tree is SIGKILLed when the trainer logs step S; the other pods are deleted as Volcano's RestartJob does (SIGTERM,
grace period, SIGKILL), then every pod is started again and the run must resume from the last complete checkpoint
— the one the runtime contract's rules pick, which is what train.py itself picks.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipekit.bundlefiles import RUN
from recipekit.paths import cache_dir
from recipekit.runtime import contract
from recipekit.validate.checks import Result
from recipekit.validate.static import Bundle, check_batch, load_bundle
from recipekit.validate.workcopy import DryRunUsageError, WorkCopy, prepare, set_master_port

METRICS_FILE = contract.METRICS_FILE
_RESUME_LINE = re.compile(r"resume from (\S+)")
_ADAPTED_LINE = re.compile(r"adapted: (.+)$")
Progress = Callable[[str], None]


@dataclass
class DryRunOptions:
    pods: int = 2
    steps: int = 8
    kill_pod: int | None = None
    at_step: int | None = None
    device: str = "cpu"  # cpu | npu | cuda
    workdir: Path | None = None
    timeout: float = 900.0  # the whole dry run, seconds
    grace: float = 20.0  # SIGTERM → SIGKILL when Volcano deletes the surviving pods

    @property
    def save_steps(self) -> int:
        return max(1, self.steps // 2)

    def check(self) -> None:
        """Raise DryRunUsageError for flags that contradict each other."""
        if self.pods < 1:
            raise DryRunUsageError(f"--pods must be at least 1 (got {self.pods})")
        if self.steps < 2:
            raise DryRunUsageError(f"--steps must be at least 2 (got {self.steps})")
        if self.at_step is not None and self.kill_pod is None:
            raise DryRunUsageError("--at-step needs --kill-pod")
        if self.kill_pod is not None:
            if not 0 <= self.kill_pod < self.pods:
                raise DryRunUsageError(f"--kill-pod {self.kill_pod}: pods are numbered 0..{self.pods - 1}")
            if self.at_step is None:
                self.at_step = min(self.steps - 1, self.save_steps + max(1, self.steps // 4))
            if not 1 <= self.at_step < self.steps:
                raise DryRunUsageError(
                    f"--at-step {self.at_step}: must be between 1 and --steps - 1 ({self.steps - 1})"
                )
        if self.device not in ("cpu", "npu", "cuda"):
            raise DryRunUsageError(f"--device {self.device}: cpu, npu or cuda")


# ---------------------------------------------------------------------------------------------- prerequisites
def _missing_modules(bundle: Bundle) -> list[str]:
    needed = ["torch", "transformers", "datasets", "tokenizers", "psutil"]
    if bundle.plan.get("zero_stage"):
        needed.append("deepspeed")
    if bundle.recipe is not None and bundle.recipe.mode.kind in ("lora", "qlora"):
        needed.append("peft")
    return [name for name in needed if importlib.util.find_spec(name) is None]


def _devices(kind: str) -> tuple[int, str]:
    """How many ``kind`` devices this machine has (asked in a child: importing torch_npu here is not wanted)."""
    probe = {
        "cuda": "import torch; print(torch.cuda.device_count())",
        "npu": "import torch, torch_npu; print(torch.npu.device_count())",
    }[kind]
    try:
        proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return 0, "probing the devices timed out"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        return 0, f"{kind} is not usable here ({last[:160]})"
    try:
        return int(proc.stdout.strip().splitlines()[-1]), ""
    except (ValueError, IndexError):
        return 0, f"could not count {kind} devices"


def extensions_dir() -> Path:
    """Where DeepSpeed's JIT-compiled ops are cached for dry runs.

    A directory of its own: torch rebuilds an op whenever the last build in its directory was made by a different
    ninja or command (the venv's ninja 1.13 and a system ninja 1.11 alternate otherwise), and pods and the prebuild
    here always run with the same environment (:func:`pod_environment`), so they share one build.
    """
    return cache_dir("torch_extensions", "dryrun")


# ----------------------------------------------------------------------------------------------------- the ops
def build_ops(work: WorkCopy, options: DryRunOptions, result: Result, progress: Progress, deadline: float) -> None:
    """Build (or find cached) the DeepSpeed C++ ops the run will load, once, timed apart from the run itself."""
    if not work.deepspeed_ops:
        result.skip("no DeepSpeed C++ op to build (DDP, or a real device)")
        return
    directory = extensions_dir()
    directory.mkdir(parents=True, exist_ok=True)
    code = f"""
import json, time, sys
import deepspeed.ops
from deepspeed.accelerator import get_accelerator
from pathlib import Path
out = []
for name in {work.deepspeed_ops!r}:
    b = get_accelerator().create_op_builder(name)
    if b is None or not deepspeed.ops.__compatible_ops__.get(b.NAME, False):
        out.append({{"op": name, "status": "incompatible"}}); continue
    cached = any(Path({str(directory)!r}).rglob(b.NAME + ".so"))
    t = time.monotonic(); b.load(verbose=False)
    out.append({{"op": b.NAME, "status": "cached" if cached else "built", "seconds": round(time.monotonic() - t, 1)}})
print(json.dumps(out))
"""
    cached = [n for n in _op_names(work.deepspeed_ops) if any(directory.rglob(f"{n}.so"))]
    if len(cached) == len(work.deepspeed_ops):
        # Loading them here would only cost an import of DeepSpeed; a stale one is rebuilt by the pods themselves.
        result.details = {
            "torch_extensions_dir": str(directory),
            "ops": [{"op": n, "status": "cached"} for n in cached],
        }
        result.reason = f"{', '.join(cached)} cached in {directory}"
        return
    progress(
        f"building DeepSpeed's C++ ops ({', '.join(_op_names(work.deepspeed_ops))}) with g++ into {directory} "
        "— once per machine, about 60-80 s"
    )
    env = {**pod_environment(work, 0, options), "PYTHONWARNINGS": "ignore"}  # exactly the pods' build environment
    log = work.logs / "deepspeed-ops.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            timeout=max(30.0, deadline - time.monotonic()),
        )
    except subprocess.TimeoutExpired:
        result.fail("<dry run>", "deepspeed ops", "building DeepSpeed's ops did not finish before the timeout")
        return
    log.write_text(proc.stdout + proc.stderr, encoding="utf-8")
    result.seconds = time.monotonic() - start
    try:
        ops = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        result.fail("<dry run>", "deepspeed ops", f"building DeepSpeed's ops failed: {tail[:400]}")
        return
    result.details = {"torch_extensions_dir": str(directory), "ops": ops}
    for op in ops:
        if op["status"] == "incompatible":
            result.fail("<dry run>", op["op"], "DeepSpeed says this op cannot be built here (ds_report shows why)")
    built = [o for o in ops if o["status"] == "built"]
    result.reason = (
        f"built {', '.join(o['op'] for o in built)} in {result.seconds:.0f} s (one-time; cached in {directory})"
        if built
        else f"cached in {directory} ({result.seconds:.1f} s to load)"
    )


def _op_names(builders: list[str]) -> list[str]:
    names = {"ShareMemCommBuilder": "deepspeed_shm_comm", "CPUAdamBuilder": "cpu_adam", "AsyncIOBuilder": "async_io"}
    return [names.get(b, b) for b in builders]


# --------------------------------------------------------------------------------------------------- the pods
def pod_environment(work: WorkCopy, index: int, options: DryRunOptions) -> dict[str, str]:
    """What Volcano's env and svc plugins inject into pod ``index``, plus the laptop's runtime settings."""
    from recipekit.validate.pods import loopback_interface

    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "GROUP_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "NODE_RANK",
        )
        and not k.startswith(("TORCHELASTIC_", "VC_", "VK_"))
    }
    bin_dir = str(Path(sys.executable).parent)
    env.update(
        {
            "VC_TASK_INDEX": str(index),
            "VK_TASK_INDEX": str(index),
            f"VC_{work.task_env}_HOSTS": ",".join(["127.0.0.1"] * options.pods),
            f"VC_{work.task_env}_NUM": str(options.pods),
            "PATH": bin_dir + os.pathsep + env.get("PATH", ""),
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TORCH_EXTENSIONS_DIR": str(extensions_dir()),
        }
    )
    if options.device == "cpu":
        env.update(
            DS_ACCELERATOR="cpu",
            CUDA_VISIBLE_DEVICES="",
            ASCEND_RT_VISIBLE_DEVICES="",
            TORCH_DEVICE_BACKEND_AUTOLOAD="0",
        )
        lo = loopback_interface()
        if lo:
            env["GLOO_SOCKET_IFNAME"] = lo
    elif options.device == "cuda":
        env.update(DS_ACCELERATOR="cuda", CUDA_VISIBLE_DEVICES=str(index))
    else:
        env.update(DS_ACCELERATOR="npu", ASCEND_RT_VISIBLE_DEVICES=str(index))
    return env


@dataclass
class Step:
    step: int
    loss: float | None
    at: float  # monotonic time this process saw the line


@dataclass
class Attempt:
    number: int
    port: int
    started: float
    steps: list[Step] = field(default_factory=list)
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    outcome: str = ""  # completed | failed | killed | timeout
    killed_at: float | None = None
    killed_step: int | None = None
    killed_processes: int = 0
    ended: float = 0.0
    log_offsets: dict[int, int] = field(default_factory=dict)


class MetricsTail:
    """Follows train.py's metrics.jsonl (rank 0 appends one JSON line per logging step)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, b""

    def read(self) -> list[dict[str, Any]]:
        try:
            size = self.path.stat().st_size
        except OSError:
            return []
        if size < self.offset:  # recreated
            self.offset, self.partial = 0, b""
        if size == self.offset:
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read(size - self.offset)
        self.offset = size
        data = self.partial + chunk
        lines = data.split(b"\n")
        self.partial = lines.pop()
        records = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records


def complete_checkpoints(output_dir: Path) -> list[int]:
    """Steps of the checkpoints a restart can resume from, oldest first (the runtime contract's rule)."""
    return sorted(step for step, _, problem in contract.checkpoints(output_dir) if problem is None)


class DryRun:
    """One dry run of a prepared work copy: attempts of N pods, an optional kill, the figures."""

    def __init__(self, work: WorkCopy, options: DryRunOptions, progress: Progress, deadline: float):
        from recipekit.validate.pods import Pod, PodSet

        self.work, self.options, self.progress, self.deadline = work, options, progress, deadline
        self.podset = PodSet()
        self.pods = [
            self.podset.add(
                Pod(
                    i,
                    ["bash", str(work.bundle / RUN)],
                    work.bundle,
                    pod_environment(work, i, options),
                    work.logs / f"pod-{i}.log",
                )
            )
            for i in range(options.pods)
        ]
        self.metrics = MetricsTail(work.output_dir / METRICS_FILE)
        self.attempts: list[Attempt] = []
        self.ports: set[int] = set()

    # -- one attempt: start every pod, watch until done / failed / killed / timed out
    def attempt(self, kill_at: int | None) -> Attempt:
        from recipekit.validate.pods import free_port

        number = len(self.attempts)
        port = free_port(self.ports)
        self.ports.add(port)
        set_master_port(self.work, port)
        attempt = Attempt(number, port, time.monotonic())
        self.attempts.append(attempt)
        label = "first start" if number == 0 else "restart (Volcano RestartJob)"
        for pod in self.pods:
            attempt.log_offsets[pod.index] = pod.log_path.stat().st_size if pod.log_path.exists() else 0
            pod.start(header=f"attempt {number}: {label}, master port {port}")
        self.progress(
            f"attempt {number}: {len(self.pods)} pod(s) running run.sh (master 127.0.0.1:{port}); "
            f"logs in {self.work.logs}"
        )
        last_remember = 0.0
        while True:
            now = time.monotonic()
            if now - last_remember > 0.5:
                self.podset.remember()
                last_remember = now
            for record in self.metrics.read():
                if "loss" in record and isinstance(record.get("step"), int):
                    loss = record.get("loss")
                    attempt.steps.append(Step(record["step"], float(loss) if loss is not None else None, now))
                    self.progress(
                        f"attempt {number}: step {record['step']}/{self.options.steps}, loss {loss:.4f}"
                        if isinstance(loss, (int, float))
                        else f"attempt {number}: step {record['step']}"
                    )
            if kill_at is not None and attempt.steps and attempt.steps[-1].step >= kill_at:
                self._kill(attempt)
                break
            codes = {pod.index: pod.poll() for pod in self.pods}
            if all(code is not None for code in codes.values()):
                attempt.outcome = "completed" if all(code == 0 for code in codes.values()) else "failed"
                break
            if any(code not in (None, 0) for code in codes.values()):
                # A failed pod: its peers fail or hang in their next collective. Give them a moment, then stop them.
                self._stop_all(grace=min(self.options.grace, 10.0))
                attempt.outcome = "failed"
                break
            if now > self.deadline:
                for pod in self.pods:
                    pod.kill()
                attempt.outcome = "timeout"
                break
            time.sleep(0.01)
        for record in self.metrics.read():  # lines written while the attempt ended
            if "loss" in record and isinstance(record.get("step"), int):
                attempt.steps.append(Step(record["step"], record.get("loss"), time.monotonic()))
        attempt.exit_codes = {pod.index: pod.poll() for pod in self.pods}
        attempt.ended = time.monotonic()
        return attempt

    def _kill(self, attempt: Attempt) -> None:
        index = self.options.kill_pod
        assert index is not None
        victim = self.pods[index]
        processes = len(victim.alive())
        victim.kill()  # SIGKILL, the whole tree: a node going away
        attempt.killed_at = time.monotonic()
        attempt.killed_step = attempt.steps[-1].step
        attempt.killed_processes = processes
        attempt.outcome = "killed"
        self.progress(
            f"killed pod {index} ({processes} processes) at step {attempt.killed_step}; deleting the "
            f"others as RestartJob does (SIGTERM, {self.options.grace:.0f} s grace, SIGKILL)"
        )
        self._stop_all(grace=self.options.grace)

    def _stop_all(self, grace: float) -> None:
        import threading

        threads = [threading.Thread(target=pod.terminate, args=(grace,)) for pod in self.pods if pod.alive()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def log_segment(self, pod_index: int, attempt: Attempt) -> str:
        path = self.pods[pod_index].log_path
        try:
            with path.open("rb") as handle:
                handle.seek(attempt.log_offsets.get(pod_index, 0))
                return handle.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def tails(self, result: Result, lines: int = 25) -> None:
        result.details["log_tails"] = {f"pod-{pod.index}": pod.tail(lines) for pod in self.pods}


# ------------------------------------------------------------------------------------------------ the dry run
def _adapted(text: str) -> list[str]:
    return [m.group(1).strip() for line in text.splitlines() if (m := _ADAPTED_LINE.search(line))]


def _resumed_from(text: str) -> str | None:
    for line in text.splitlines():
        match = _RESUME_LINE.search(line)
        if match:
            return match.group(1)
    return None


def _rate(steps: list[Step]) -> float | None:
    if len(steps) < 2 or steps[-1].at <= steps[0].at:
        return None
    return (steps[-1].step - steps[0].step) / (steps[-1].at - steps[0].at)


def _final_state(output_dir: Path) -> int | None:
    try:
        return int(json.loads((output_dir / "trainer_state.json").read_text(encoding="utf-8"))["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_dry_run(bundle: Bundle, options: DryRunOptions, progress: Progress = lambda message: None) -> list[Result]:
    """Prepare the work copy, build DeepSpeed's ops, run the pods (kill and restart them), and report."""
    options.check()
    started = time.monotonic()
    deadline = started + options.timeout
    prep = Result("dryrun.prepare", "dry run: work copy of the bundle with the laptop substitutions")
    ops = Result("dryrun.ops", "dry run: DeepSpeed C++ ops (built once, cached)")
    train = Result(
        "dryrun.train",
        f"dry run: {options.pods} pod(s) × run.sh → train.py, {options.steps} steps, "
        f"checkpoint at {options.save_steps}",
    )
    results = [prep, ops, train]
    resume = None
    if options.kill_pod is not None:
        resume = Result(
            "dryrun.resume",
            f"dry run: kill pod {options.kill_pod} at step {options.at_step}, RestartJob, "
            "resume from the last complete checkpoint",
        )
        results.append(resume)

    def skip_all(reason: str) -> list[Result]:
        return [r.skip(reason) for r in results]

    if bundle.doc is None or bundle.recipe is None or bundle.run_sh is None or "runtime/train.py" not in bundle.raw:
        return skip_all("needs a parseable recipe.yaml, run.sh and train.py (see files.parse)")
    if bundle.plan.get("zero_stage") and bundle.ds_config is None:
        return skip_all("a ZeRO bundle without a parseable ds_config.json (see files.parse)")
    missing = _missing_modules(bundle)
    if missing:
        return skip_all(f"{', '.join(missing)} not installed here (pip install 'recipekit[train]')")
    if shutil.which("bash") is None:
        return skip_all("bash not found")
    if options.device != "cpu":
        count, why = _devices(options.device)
        if count == 0:
            return skip_all(why or f"no {options.device} device here")
        if count < options.pods:
            return skip_all(
                f"{options.pods} pods need {options.pods} {options.device} devices (one each); found {count}"
            )

    progress(f"preparing the work copy of {bundle.path}")
    start = time.monotonic()
    work = prepare(bundle, options)
    prep.seconds = time.monotonic() - start
    prep.details = {"workdir": str(work.root), "substitutions": [s.to_json() for s in work.substitutions]}
    prep.reason = f"{len(work.substitutions)} substitutions, listed in {work.root / 'substitutions.json'}"
    copy_check = check_batch(load_bundle(work.bundle))
    for finding in copy_check.findings:  # the substitutions themselves must leave a consistent bundle
        prep.fail(finding.file, finding.field, "work copy: " + finding.message, finding.hint)

    build_ops(work, options, ops, progress, deadline)
    if ops.failed:
        train.skip("the DeepSpeed ops could not be built")
        if resume:
            resume.skip("the DeepSpeed ops could not be built")
        return results

    run = DryRun(work, options, progress, deadline)
    with run.podset:
        try:
            _train(run, train, resume)
        finally:
            run.podset.kill_all()
            left = run.podset.leftovers()
            if left:
                train.fail("<dry run>", "processes", f"processes still alive after cleanup: {left}")
    summary = {"wall_s": round(time.monotonic() - started, 1), "workdir": str(work.root)}
    train.details.update(summary)
    (work.root / "report.json").write_text(
        json.dumps([r.to_json() for r in results], indent=2, default=str) + "\n", encoding="utf-8"
    )
    return results


def _train(run: DryRun, train: Result, resume: Result | None) -> None:
    options, work = run.options, run.work
    first = run.attempt(kill_at=options.at_step if options.kill_pod is not None else None)
    train.seconds = first.ended - first.started
    pod0 = run.log_segment(0, first)
    notes = _adapted(pod0)
    losses = [s.loss for s in first.steps if s.loss is not None]
    details: dict[str, Any] = {
        "pods": options.pods,
        "exit_codes": first.exit_codes,
        "time_to_first_step_s": round(first.steps[0].at - first.started, 2) if first.steps else None,
        "steps_per_s": round(r, 2) if (r := _rate(first.steps)) else None,
        "first_loss": losses[0] if losses else None,
        "adapted_by_train_py": notes,
        "logs": str(work.logs),
    }
    train.details.update(details)
    if first.outcome == "timeout":
        train.fail(
            "<dry run>",
            "timeout",
            f"no result within --timeout {options.timeout:.0f} s "
            f"(last step seen: {first.steps[-1].step if first.steps else 'none'})",
        )
        run.tails(train)
        if resume:
            resume.skip("the first attempt timed out")
        return
    if first.outcome == "failed":
        bad = {i: c for i, c in first.exit_codes.items() if c not in (0, None)}
        train.fail(
            "<dry run>", "exit codes", f"pod(s) exited non-zero: {bad}; log tails below, full logs in {work.logs}"
        )
        run.tails(train)
        if resume:
            resume.skip("the first attempt failed")
        return

    if first.outcome == "completed":
        _judge_completion(run, train, first, losses)
        if resume is not None:
            resume.fail(
                "<dry run>",
                "--at-step",
                f"training finished before step {options.at_step} was seen in {METRICS_FILE}, so no pod was killed",
                hint="choose a smaller --at-step or more --steps",
            )
        return

    # killed: RestartJob
    assert resume is not None and first.killed_at is not None
    train.details.update(killed_pod=options.kill_pod, killed_at_step=first.killed_step)
    train.reason = (
        f"{len(first.steps)} steps before the kill; {details['time_to_first_step_s']} s to the first step, "
        f"{details['steps_per_s']} steps/s"
    )
    checkpoints = complete_checkpoints(work.output_dir)
    expected = checkpoints[-1] if checkpoints else None
    resume.details.update(
        killed_pod=options.kill_pod,
        kill_requested_at_step=options.at_step,
        killed_at_step=first.killed_step,
        killed_processes=first.killed_processes,
        complete_checkpoints_at_restart=checkpoints,
        teardown_s=round(time.monotonic() - first.killed_at, 2),
        survivor_exit_codes={i: c for i, c in first.exit_codes.items() if i != options.kill_pod},
    )
    start = time.monotonic()
    second = run.attempt(kill_at=None)
    resume.seconds = time.monotonic() - start
    text = run.log_segment(0, second)
    resumed_from = _resumed_from(text)
    resumed_step = None
    if resumed_from and resumed_from != "scratch":
        tail = resumed_from.rstrip("/").split("-")[-1]
        resumed_step = int(tail) if tail.isdigit() else None
    first_new = second.steps[0] if second.steps else None
    mttr = round(first_new.at - first.killed_at, 2) if first_new else None
    resume.details.update(
        resumed_from=resumed_from,
        resumed_step=resumed_step,
        first_step_after_restart=first_new.step if first_new else None,
        mttr_s=mttr,
        restart_to_first_step_s=round(first_new.at - second.started, 2) if first_new else None,
        exit_codes=second.exit_codes,
    )
    if second.outcome != "completed":
        what = "timed out" if second.outcome == "timeout" else f"failed (exit codes {second.exit_codes})"
        resume.fail("<dry run>", "restart", f"the restarted job {what}; full logs in {work.logs}")
        run.tails(resume)
        return
    if resumed_step != expected:
        resume.fail(
            "<dry run>",
            "resume",
            f"resumed from {resumed_from or 'nothing'}, but the last complete "
            f"checkpoint at the restart was {expected if expected is not None else 'none'}",
        )
    if first_new is not None and expected is not None and first_new.step != expected + 1:
        resume.fail(
            "<dry run>",
            "resume",
            f"the first step after the restart is {first_new.step}, expected "
            f"{expected + 1} (resuming at checkpoint-{expected})",
        )
    before = {s.step: s.loss for s in first.steps}
    replayed = [
        (s.step, before[s.step], s.loss)
        for s in second.steps
        if s.step in before and isinstance(s.loss, (int, float)) and isinstance(before[s.step], (int, float))
    ]
    if replayed:
        # Steps trained twice (after the checkpoint, before the kill): same data, same state, so the same loss.
        resume.details["replayed_steps"] = [step for step, _, _ in replayed]
        resume.details["replayed_loss_max_abs_diff"] = max(abs(a - b) for _, a, b in replayed)
    replay = resume.details.get("replayed_loss_max_abs_diff")
    resume.reason = (
        f"killed pod {options.kill_pod} at step {first.killed_step}; resumed from "
        f"{f'checkpoint-{resumed_step}' if resumed_step is not None else 'scratch'} (last complete: "
        f"{expected}); MTTR {mttr} s"
        + (f"; replayed steps' loss differs by {replay:.2g}" if replay is not None else "")
    )
    all_losses = losses + [s.loss for s in second.steps if s.loss is not None]
    _judge_completion(run, train, second, all_losses, attempts=[first, second])


def _judge_completion(
    run: DryRun, train: Result, last: Attempt, losses: list[Any], attempts: list[Attempt] | None = None
) -> None:
    options, work = run.options, run.work
    final_step = _final_state(work.output_dir)
    checkpoints = complete_checkpoints(work.output_dir)
    weights = [name for name in contract.WEIGHT_FILES if (work.output_dir / name).is_file()]
    finite = [loss for loss in losses if isinstance(loss, (int, float)) and math.isfinite(loss)]
    train.details.update(
        final_step=final_step,
        checkpoints=checkpoints,
        final_weights=weights,
        final_loss=finite[-1] if finite else None,
        exit_codes=last.exit_codes,
    )
    if final_step != options.steps:
        train.fail("<dry run>", "trainer_state.json", f"final global_step {final_step}, expected {options.steps}")
    if options.save_steps not in checkpoints and options.kill_pod is None:
        train.fail(
            "<dry run>",
            "checkpoints",
            f"no complete checkpoint-{options.save_steps} (complete: {checkpoints or 'none'})",
        )
    if options.steps not in checkpoints:
        train.fail(
            "<dry run>", "checkpoints", f"no complete checkpoint-{options.steps} (complete: {checkpoints or 'none'})"
        )
    if not weights:
        train.fail("<dry run>", "final model", f"no model weights in {work.output_dir} after training")
    if len(finite) != len(losses) or not losses:
        train.fail("<dry run>", "loss", f"losses not all finite: {losses}")
    if train.failed:
        run.tails(train)
    elif attempts is None:
        d = train.details
        train.reason = (
            f"{options.steps} steps; {d['time_to_first_step_s']} s to the first step, {d['steps_per_s']} "
            f"steps/s; loss {_fmt(d['first_loss'])} → {_fmt(d['final_loss'])}; checkpoints {checkpoints}"
        )
    else:
        d = train.details
        train.reason = (
            f"{options.steps} steps over {len(attempts)} attempts; {d['time_to_first_step_s']} s to the first "
            f"step, {d['steps_per_s']} steps/s; loss {_fmt(d['first_loss'])} → {_fmt(d['final_loss'])}; "
            f"checkpoints {checkpoints}"
        )


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else str(value)
