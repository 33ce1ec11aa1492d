"""DeepSpeed's C++ extensions (its "ops") for the dry run: built once per machine, cached, timed apart from training.

DeepSpeed compiles some ops with g++ the first time a process loads them (the CPU accelerator's shared-memory
collective; CPU Adam for offload; async I/O for NVMe). Inside a pod that minute would count as time to the first step
and every pod would race to build the same op; so the dry run builds them here first, in the pods' exact
environment, and the pods then load the cached build.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from recipekit.base.paths import cache_dir
from recipekit.validate.dryrun.workdir.workcopy import WorkCopy
from recipekit.validate.shared.childpython import python_argv, safe_env
from recipekit.validate.shared.results import Result


def extensions_dir() -> Path:
    """Where DeepSpeed's JIT-compiled ops are cached for dry runs.

    A directory of its own: torch rebuilds an op whenever the last build in its directory was made by a different
    ninja or command (the venv's ninja 1.13 and a system ninja 1.11 alternate otherwise), and pods and the prebuild
    here always run with the same environment (:func:`recipekit.validate.dryrun.cluster.attempts.pod_environment`), so
    they share one build.
    """
    return cache_dir("torch_extensions", "dryrun")


# ---------------------------------------------------------------------------------------------- the extensions
def build_extensions(
    work: WorkCopy, env: dict[str, str], result: Result, progress: Callable[[str], None], deadline: float
) -> None:
    """Build (or find cached) the DeepSpeed C++ ops the run will load, once, timed apart from the run itself.

    ``env`` must be exactly a pod's environment (see :func:`extensions_dir` for why); a build that fails or cannot
    finish before ``deadline`` fails ``result``, and the pods are then not started.
    """
    if not work.deepspeed_extensions:
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
for name in {work.deepspeed_extensions!r}:
    b = get_accelerator().create_op_builder(name)
    if b is None or not deepspeed.ops.__compatible_ops__.get(b.NAME, False):
        out.append({{"op": name, "status": "incompatible"}}); continue
    cached = any(Path({str(directory)!r}).rglob(b.NAME + ".so"))
    t = time.monotonic(); b.load(verbose=False)
    out.append({{"op": b.NAME, "status": "cached" if cached else "built", "seconds": round(time.monotonic() - t, 1)}})
print(json.dumps(out))
"""
    cached = [n for n in _op_names(work.deepspeed_extensions) if any(directory.rglob(f"{n}.so"))]
    if len(cached) == len(work.deepspeed_extensions):
        # Loading them here would only cost an import of DeepSpeed; a stale one is rebuilt by the pods themselves.
        result.details = {
            "torch_extensions_dir": str(directory),
            "ops": [{"op": n, "status": "cached"} for n in cached],
        }
        result.reason = f"{', '.join(cached)} cached in {directory}"
        return
    progress(
        f"building DeepSpeed's C++ ops ({', '.join(_op_names(work.deepspeed_extensions))}) with g++ into {directory} "
        "— once per machine, one to three minutes on 2 cores"
    )
    env = {**env, "PYTHONWARNINGS": "ignore"}
    log = work.logs / "deepspeed-ops.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    try:
        proc = subprocess.run(
            python_argv("-c", code),
            capture_output=True,
            text=True,
            env=safe_env(env),
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
