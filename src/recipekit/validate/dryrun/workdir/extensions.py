"""DeepSpeed's C++ extensions (its "ops") for the dry run: built once per machine, cached, timed apart from training.

DeepSpeed compiles some ops with g++ the first time a process loads them (the CPU accelerator's shared-memory
collective; CPU Adam for offload; async I/O for NVMe). Inside a pod that minute would count as time to the first step
and every pod would race to build the same op; so the dry run builds them here first, in the pods' exact
environment, and the pods then load the cached build.

torch builds and loads an op under its ``FileBaton``: a ``lock`` file in the op's build directory whose existence is
the lock, removed when the build ends, waited on (forever) while it exists. A build killed in between leaves it, and
every later load would wait on it. So the cache has a lock of its own that a process holds
(:mod:`~recipekit.validate.dryrun.workdir.locks`): a dry run holds it shared while its pods live (they are given the
descriptor), and exclusively to build or to clear a baton; under the exclusive lock no process of any dry run can be
inside torch's baton, so a ``lock`` file found then is a dead build's and is removed, with a line saying so. A build
that completes writes a marker for the torch and DeepSpeed versions it was made with; an op without one is built again
from a clean directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from recipekit.base.paths import cache_dir
from recipekit.validate.dryrun.options import BUILD_PROGRESS
from recipekit.validate.dryrun.workdir.locks import FileLock
from recipekit.validate.dryrun.workdir.workcopy import WorkCopy
from recipekit.validate.shared.childpython import python_argv, safe_env
from recipekit.validate.shared.results import Result


def extensions_dir() -> Path:
    """Where DeepSpeed's JIT-compiled ops are cached for dry runs: one directory per Python installation and torch
    and DeepSpeed version.

    A directory of its own: torch rebuilds an op whenever the last build in its directory was made by a different
    ninja or command, and the command names the installation's own source paths, so two environments on one machine
    (two virtualenvs, a system ninja and the venv's) sharing a directory would rebuild it in turn, inside the pods,
    each waiting on the other's build. Pods and the prebuild here always run with the same environment
    (:func:`recipekit.validate.dryrun.cluster.attempts.pod_environment`), so they share one build.
    """
    return cache_dir("torch_extensions", "dryrun", _installation())


def _installation() -> str:
    """A short name for this installation: the torch and DeepSpeed versions and a digest of the interpreter's
    prefix (a name, not a path: safe as one directory)."""
    digest = hashlib.sha256(sys.prefix.encode("utf-8", "surrogateescape")).hexdigest()[:10]
    versions = "-".join(re.sub(r"[^A-Za-z0-9.]+", "_", _version(name)) for name in ("torch", "deepspeed"))
    return f"{versions}-{digest}"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


#: The cache's own lock (a flock held by live processes), in the cache directory.
CACHE_LOCK = "recipekit.lock"
#: torch's FileBaton file in an op's build directory.
BATON = "lock"
#: How long a baton may exist while another dry run's pod loads the op before it is taken for a dead build's.
BATON_GRACE_S = 5.0
_OPS_LINE = "RECIPEKIT_OPS "
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")
_OP_NAMES = {"ShareMemCommBuilder": "deepspeed_shm_comm", "CPUAdamBuilder": "cpu_adam", "AsyncIOBuilder": "async_io"}


def _versions() -> str:
    """The installation a finished build was made for, as its marker records it."""
    return f"torch {_version('torch')}, deepspeed {_version('deepspeed')}, python {sys.prefix}"


def _marker(directory: Path, op: str) -> Path:
    return directory / f".{op}.recipekit-built"


def is_built(directory: Path, op: str) -> bool:
    """Whether ``op`` was built to the end in ``directory`` for the installed torch and DeepSpeed."""
    try:
        recorded = _marker(directory, op).read_text(encoding="utf-8").strip()
    except OSError:
        return False
    return recorded == _versions() and any((directory / op).glob("*.so"))


def batons(directory: Path, ops: list[str]) -> list[Path]:
    """The torch FileBaton files present in the build directories of ``ops``."""
    return [directory / op / BATON for op in ops if (directory / op / BATON).exists()]


def clear_dead_builds(directory: Path, ops: list[str], progress: Callable[[str], None]) -> list[Path]:
    """Remove the batons of ``ops`` and the half-built directory of any op not built to the end; the caller holds
    the cache's lock exclusively, so no live process is inside a baton. Returns the batons removed."""
    cleared = batons(directory, ops)
    for baton in cleared:
        op = baton.parent.name
        if is_built(directory, op):
            baton.unlink(missing_ok=True)
            progress(f"cleared a stale lock of DeepSpeed's {op} op ({baton}): the process that held it is gone")
        else:
            shutil.rmtree(baton.parent, ignore_errors=True)
            progress(
                f"cleared an interrupted build of DeepSpeed's {op} op ({baton}): the process that held it is gone; "
                "it is built again"
            )
    return cleared


def _ready(directory: Path, ops: list[str]) -> bool:
    """Under the shared lock: whether every op is built and no baton is left (a live pod of another dry run
    holds one for a moment while it loads the op)."""
    grace = time.monotonic() + BATON_GRACE_S
    while batons(directory, ops) and time.monotonic() < grace:
        time.sleep(0.1)
    return not batons(directory, ops) and all(is_built(directory, op) for op in ops)


def lock_cache(
    directory: Path, ops: list[str], progress: Callable[[str], None], deadline: float
) -> tuple[FileLock | None, list[str]]:
    """Hold the cache for this dry run: returns the lock, held shared (None at ``deadline``), and the ops still to
    build, which the caller builds while the lock is held exclusively (it is left exclusive then).

    The shared lock is let go before the exclusive one is waited for (two runs each holding it shared and each
    waiting to hold it alone would wait for ever), and whoever waits looks again under the shared lock each time:
    another run may have built the ops or cleared the batons meanwhile."""
    directory.mkdir(parents=True, exist_ok=True)
    lock = FileLock.open(directory / CACHE_LOCK)
    said = False
    while time.monotonic() < deadline:
        if lock.try_lock(shared=True):
            if _ready(directory, ops):
                return lock, []
            lock.unlock()
            if lock.try_lock(shared=False):
                lock.write_holder("a dry run building DeepSpeed's ops")
                clear_dead_builds(directory, ops, progress)
                missing = [op for op in ops if not is_built(directory, op)]
                if not missing:
                    lock.lock(shared=True)
                return lock, missing
        if not said:
            holder = lock.holder()  # the last builder: named only while it lives (pods holding it are not named)
            named = f"the last builder: {holder}; " if _alive(holder) else ""
            progress(
                f"waiting for the other dry runs using DeepSpeed's ops here to finish ({named}the lock is {lock.path})"
            )
            said = True
        time.sleep(0.5)
    lock.close()
    return None, ops


def _alive(holder: str) -> bool:
    """Whether the process a holder line names ("PID n, started ...") is alive."""
    found = re.match(r"PID (\d+),", holder)
    if found is None:
        return False
    try:
        os.kill(int(found[1]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


# ---------------------------------------------------------------------------------------------- the extensions
def build_extensions(
    work: WorkCopy, env: dict[str, str], result: Result, progress: Callable[[str], None], deadline: float
) -> FileLock | None:
    """Build (or find cached) the DeepSpeed C++ ops the run will load, once, timed apart from the run itself;
    returns the cache's lock, held shared, for the pods to inherit (None without ops, or when ``result`` failed).

    ``env`` must be exactly a pod's environment (see :func:`extensions_dir` for why); a build that fails or cannot
    finish before ``deadline`` fails ``result``, and the pods are then not started.
    """
    if not work.deepspeed_extensions:
        result.skip("no DeepSpeed C++ op to build (DDP, or a real device)")
        return None
    directory = extensions_dir()
    names = _op_names(work.deepspeed_extensions)
    lock, missing = lock_cache(directory, names, progress, deadline)
    if lock is None:
        result.fail("<dry run>", "deepspeed ops", f"the cache {directory} was still locked at --timeout")
        return None
    result.details = {"torch_extensions_dir": str(directory)}
    if not missing:
        result.details["ops"] = [{"op": n, "status": "cached"} for n in names]
        result.reason = f"{', '.join(names)} cached in {directory}"
        return lock
    try:
        _build(work, env, result, progress, deadline, lock)
    except BaseException:  # Ctrl-C, SIGTERM: this process lets go at once (a live builder child keeps its hold)
        lock.close()
        raise
    if result.failed:
        lock.close()
        return None
    for op in result.details.get("ops", []):
        if op.get("status") in ("built", "cached"):
            _marker(directory, str(op["op"])).write_text(_versions() + "\n", encoding="utf-8")
    lock.lock(shared=True)
    return lock


def _builder_code(builders: list[str], directory: Path) -> str:
    return f"""
import json, time
import deepspeed.ops
from deepspeed.accelerator import get_accelerator
from pathlib import Path
out = []
for name in {builders!r}:
    b = get_accelerator().create_op_builder(name)
    if b is None or not deepspeed.ops.__compatible_ops__.get(b.NAME, False):
        out.append({{"op": name, "status": "incompatible"}}); continue
    cached = any(Path({str(directory)!r}).glob(b.NAME + "/*.so"))
    print("building " + b.NAME, flush=True)
    t = time.monotonic(); b.load(verbose=True)
    out.append({{"op": b.NAME, "status": "cached" if cached else "built", "seconds": round(time.monotonic() - t, 1)}})
print({_OPS_LINE!r} + json.dumps(out), flush=True)
"""


def _build(
    work: WorkCopy,
    env: dict[str, str],
    result: Result,
    progress: Callable[[str], None],
    deadline: float,
    lock: FileLock,
) -> None:
    """The build itself, in a child that holds the cache's lock too (killed, it releases it; its parent killed, it
    keeps it until it ends), its progress as one rewritten line."""
    directory = extensions_dir()
    names = _op_names(work.deepspeed_extensions)
    progress(
        f"building DeepSpeed's C++ ops ({', '.join(names)}) with g++ into {directory} — once per machine and "
        "version, one to three minutes on 2 cores"
    )
    log = work.logs / "deepspeed-ops.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    proc = subprocess.Popen(
        python_argv("-c", _builder_code(work.deepspeed_extensions, directory)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        env=safe_env({**env, "PYTHONWARNINGS": "ignore"}),
        pass_fds=(lock.fd,),
    )
    late = threading.Event()

    def too_late() -> None:
        late.set()
        proc.kill()

    timer = threading.Timer(max(30.0, deadline - time.monotonic()), too_late)
    timer.start()
    lines: list[str] = []
    state = {"op": names[0], "step": ""}
    done = threading.Event()

    def tick() -> None:  # the one line, rewritten every second with the op, ninja's step and the time so far
        while not done.wait(1.0):
            progress(f"{BUILD_PROGRESS} {state['op']}{state['step']}, {time.monotonic() - start:.0f} s")

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line[:2000])
            if line.startswith("building "):
                state["op"] = line.split()[-1][:60]
            step = _NINJA_STEP.match(line)
            if step:
                state["step"] = f" [{step[1]}/{step[2]}]"
        proc.wait()
    finally:
        done.set()
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ticker.join()
    log.write_text("".join(lines[-5000:]), encoding="utf-8")
    result.seconds = time.monotonic() - start
    if late.is_set():
        result.fail("<dry run>", "deepspeed ops", "building DeepSpeed's ops did not finish before the timeout")
        return
    _judge_build(result, lines, directory)


def _judge_build(result: Result, lines: list[str], directory: Path) -> None:
    reported = [line[len(_OPS_LINE) :] for line in lines if line.startswith(_OPS_LINE)]
    try:
        ops = json.loads(reported[-1])
    except (ValueError, IndexError):
        tail = " | ".join(line.strip() for line in lines[-3:])
        result.fail("<dry run>", "deepspeed ops", f"building DeepSpeed's ops failed: {tail[:400]}")
        return
    result.details["ops"] = ops
    for op in ops:
        if op["status"] == "incompatible":
            result.fail("<dry run>", op["op"], "DeepSpeed says this op cannot be built here (ds_report shows why)")
    built = [o for o in ops if o["status"] == "built"]
    result.reason = (
        f"built {', '.join(o['op'] for o in built)} in {result.seconds:.0f} s (once per machine and version; cached "
        f"in {directory})"
        if built
        else f"cached in {directory} ({result.seconds:.1f} s to load)"
    )


def _op_names(builders: list[str]) -> list[str]:
    return [_OP_NAMES.get(b, b) for b in builders]
