"""Opt-in burn-in before a key run (``ops.burn_in_s``): minutes of the work training does, with a verdict per node.

Every rank loops for ``burn_in_s`` seconds: a square matmul in the training precision (bf16 on a device, fp32 on
CPU), timed on its own, then an all-reduce of a 64 MB buffer across all ranks, timed too; after each round the ranks
agree (one all-reduce MAX of a flag) whether the time is up, so every rank runs the same rounds and none is left in a
collective. A rank's rate is its matmul FLOPs / its matmul time; a node's rate is its slowest rank's. A node is slow
below ``burn_in_slow_fraction`` of the median node's rate, or on a device below the rate the plan assumes for
training (the device's peak × the planned MFU: a healthy device's bare matmul is well above it). Standard library and
torch only.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

#: Side of the square matmul: large enough to run a device near its peak, small enough for a CPU round in seconds.
SIDE = {"cpu": 512, "cuda": 8192, "npu": 8192}
#: Bytes of the all-reduce buffer of each round.
ALLREDUCE_BYTES = 64 * 1024 * 1024


def run(seconds: float, device: torch.device, delay: float = 0.0) -> dict[str, Any]:
    """This rank's burn-in: rounds, achieved TFLOP/s and all-reduce time per round."""
    side = SIDE.get(device.type, 1024)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    a = torch.randn(side, side, dtype=dtype, device=device)
    b = torch.randn(side, side, dtype=dtype, device=device)
    buffer = torch.ones(ALLREDUCE_BYTES // 4, dtype=torch.float32, device=device)
    matmul_s = allreduce_s = 0.0
    rounds = 0
    started = time.monotonic()
    while True:
        start = time.perf_counter()
        if delay:
            time.sleep(delay)
        for _ in range(4):
            a = torch.mm(a, b) / side  # scaled: values stay finite however long it runs
        _synchronize(device)
        matmul_s += time.perf_counter() - start
        start = time.perf_counter()
        dist.all_reduce(buffer)
        _synchronize(device)
        allreduce_s += time.perf_counter() - start
        buffer.fill_(1.0)
        rounds += 1
        done = torch.tensor([1.0 if time.monotonic() - started >= seconds else 0.0], device=device)
        dist.all_reduce(done, op=dist.ReduceOp.MAX)
        if done.item() > 0:
            break
    flops = rounds * 4 * 2 * side**3
    return {
        "rounds": rounds,
        "tflops": round(flops / matmul_s / 1e12, 4) if matmul_s > 0 else 0.0,
        "allreduce_ms": round(1000 * allreduce_s / rounds, 2),
        "finite": bool(torch.isfinite(a).all().item()),
    }


def _synchronize(device: torch.device) -> None:
    if device.type in ("cuda", "npu"):
        getattr(torch, device.type).synchronize(device)


def judge(
    results: list[dict[str, Any]], pods: list[int], hosts: list[str], fraction: float, bar: float | None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Per node: its rate (its slowest rank's), pass or slow, and the problems (one per slow node) in one list."""
    nodes: dict[int, dict[str, Any]] = {}
    for rank, result in enumerate(results):
        node = nodes.setdefault(pods[rank], {"pod": pods[rank], "host": hosts[rank], "tflops": float("inf")})
        node["tflops"] = min(node["tflops"], float(result["tflops"]))
        node["finite"] = node.get("finite", True) and bool(result["finite"])
        node["allreduce_ms"] = max(node.get("allreduce_ms", 0.0), float(result["allreduce_ms"]))
    middle = statistics.median(n["tflops"] for n in nodes.values())
    problems = []
    for node in nodes.values():
        reasons = []
        if len(nodes) > 1 and node["tflops"] < fraction * middle:
            reasons.append(f"{node['tflops']:.3g} TFLOP/s, the median node {middle:.3g}")
        if bar is not None and node["tflops"] < bar:
            reasons.append(f"{node['tflops']:.3g} TFLOP/s, below the {bar:.3g} the plan assumes")
        if not node["finite"]:
            reasons.append("its matmul produced NaN or inf (a faulty device)")
        node["verdict"] = "slow" if reasons else "pass"
        if reasons:
            problems.append(f"burn-in: pod {node['pod']} ({node['host']}): {'; '.join(reasons)}")
    verdicts = sorted(nodes.values(), key=lambda n: n["pod"])
    return verdicts, problems
