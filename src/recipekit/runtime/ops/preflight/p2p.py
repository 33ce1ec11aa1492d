"""Preflight's point-to-point test: which node or which link is the slow one among N.

One all-reduce measures the slowest link of the ring, not which one it is. This test pairs the ranks up, round by
round, and times each pair alone: in round ``k`` rank ``r`` exchanges ``p2p_size_mb`` with rank ``r XOR k`` (both
directions at once, ``torch.distributed.batch_isend_irecv``: gloo on CPU, HCCL or NCCL on devices). XOR pairing
makes every round a perfect matching, so a pair's time depends on its two ends only and never on a third rank
waiting in another pair, which a ring shift (``r → r + k``) cannot promise; ``world − 1`` rounds cover every pair.
Beyond ``p2p_max_rounds`` the rounds whose pairs cross nodes are taken first: every rank is in every round, so a
slow node is found in any of them, a slow link only in the round that pairs its two ends.

A pair's time is the slower of its two ends' best of ``p2p_iterations`` exchanges (the best, so a hiccup of a
shared machine does not name a healthy link); its bandwidth is bytes / time in each direction. Pairs are judged
against pairs of their own class (within a node: HCCS/NVLink; across nodes: RoCE/InfiniBand), by the class's upper
quartile: a pair below ``p2p_slow_fraction`` of it is slow. A rank all of whose pairs (two or more) are slow names its
node; a slow pair between otherwise healthy ranks names the link. On an accelerator a pair of the plan's link class
below ``bandwidth_warn_gbps`` is slow too (with two nodes every cross pair touches both, and only the absolute bar can
tell). Standard library and torch only.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ...boundary import exitcodes

#: Untimed exchanges per pair before the timed ones (connection setup, allocator warm-up).
WARMUP = 1


def slow_delay(rank: int, environ: Any = None) -> float:
    """TESTING ONLY: the seconds this rank waits before each transfer (``exitcodes.SLOW_RANK_ENV`` =
    ``<rank>:<seconds>``, the dry run's slow node); 0 for every other rank and for a malformed value."""
    value = (os.environ if environ is None else environ).get(exitcodes.SLOW_RANK_ENV, "")
    who, _, seconds = value.partition(":")
    try:
        delay = float(seconds)
    except ValueError:
        return 0.0
    if not who.isdigit() or int(who) != rank or not math.isfinite(delay) or not 0 < delay <= 60:
        return 0.0
    return delay


def rounds(world: int, local: int, max_rounds: int) -> list[int]:
    """The XOR offsets to run, cross-node ones first (``k ≥ local`` pairs ranks of different nodes when every node
    runs ``local`` ranks, a power of two; otherwise each pair is classed by its own ends), at most ``max_rounds``."""
    if world < 2:
        return []
    top = 1 << (world - 1).bit_length()
    offsets = [k for k in range(1, top) if any((r ^ k) < world for r in range(world))]
    cross = [k for k in offsets if k >= local]
    return (cross + [k for k in offsets if k < local])[:max_rounds]


def measure(
    offsets: list[int], size_mb: float, iterations: int, device: torch.device, delay: float = 0.0
) -> dict[str, float]:
    """This rank's best time (seconds) of its exchange in each round, keyed by the offset as text (JSON)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    count = max(1, int(size_mb * 1e6) // 4)
    send = torch.ones(count, dtype=torch.float32, device=device)
    recv = torch.empty_like(send)
    found: dict[str, float] = {}
    for k in offsets:
        dist.barrier()  # one round at a time: pairs of two rounds never share a link's time
        peer = rank ^ k
        if peer >= world:
            continue
        best = math.inf
        for i in range(WARMUP + iterations):
            start = time.perf_counter()
            if delay:
                time.sleep(delay)
            ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            if device.type in ("cuda", "npu"):
                getattr(torch, device.type).synchronize(device)
            if i >= WARMUP:
                best = min(best, time.perf_counter() - start)
        found[str(k)] = best
    dist.barrier()
    return found


@dataclass(frozen=True)
class Pair:
    """One measured pair: its ranks, their pods, whether it crosses nodes, and its bandwidth (GB/s each way)."""

    a: int
    b: int
    pod_a: int
    pod_b: int
    gbps: float

    @property
    def cross(self) -> bool:
        return self.pod_a != self.pod_b


def pairs(times: list[dict[str, float]], pods: list[int], size_bytes: int) -> list[Pair]:
    """Every measured pair once, from each rank's times (the slower end's time counts)."""
    found = []
    for a, mine in enumerate(times):
        for key, seconds in mine.items():
            b = a ^ int(key)
            if b <= a or b >= len(times) or key not in times[b]:
                continue
            slower = max(float(seconds), float(times[b][key]))
            gbps = size_bytes / slower / 1e9 if slower > 0 and math.isfinite(slower) else 0.0
            found.append(Pair(a, b, pods[a], pods[b], round(gbps, 3)))
    return found


def slow_pairs(found: list[Pair], fraction: float, floor_gbps: float | None, floor_cross: bool) -> set[Pair]:
    """The pairs below ``fraction`` of their class's upper quartile (or below the absolute floor, for the class the
    floor is the link rating of)."""
    slow: set[Pair] = set()
    for cross in (False, True):
        group = [p for p in found if p.cross is cross]
        if not group:
            continue
        values = sorted(p.gbps for p in group)
        reference = statistics.quantiles(values, n=4, method="inclusive")[2] if len(values) > 1 else values[0]
        slow |= {p for p in group if p.gbps < fraction * reference}
        if floor_gbps is not None and cross is floor_cross:
            slow |= {p for p in group if p.gbps < floor_gbps}
    return slow


def verdict(found: list[Pair], slow: set[Pair], hosts: list[str]) -> tuple[list[int], list[Pair]]:
    """(the ranks all of whose two or more pairs are slow, the slow pairs neither of whose ends is such a rank)."""
    ranks = sorted({p.a for p in found} | {p.b for p in found})
    bad = [r for r in ranks if _all_slow(r, found, slow)]
    links = [p for p in sorted(slow, key=lambda p: (p.a, p.b)) if p.a not in bad and p.b not in bad]
    return bad, links


def _all_slow(rank: int, found: list[Pair], slow: set[Pair]) -> bool:
    mine = [p for p in found if rank in (p.a, p.b)]
    return len(mine) >= 2 and all(p in slow for p in mine)


def describe(found: list[Pair], bad: list[int], links: list[Pair], pods: list[int], hosts: list[str]) -> str:
    """The finding in one line: the slow nodes by pod and host, then the slow links."""
    parts = []
    for pod in sorted({pods[r] for r in bad}):
        ranks = [r for r in bad if pods[r] == pod]
        mine = [p.gbps for p in found if p.a in ranks or p.b in ranks]
        parts.append(
            f"slow node: pod {pod} ({hosts[ranks[0]]}), rank(s) {', '.join(map(str, ranks))}: every pair with it "
            f"at most {max(mine):.2f} GB/s"
        )
    for p in links:
        parts.append(
            f"slow link: rank {p.a} (pod {p.pod_a}, {hosts[p.a]}) ↔ rank {p.b} (pod {p.pod_b}, {hosts[p.b]}) "
            f"{p.gbps:.2f} GB/s"
        )
    return "; ".join(parts)


def summary(found: list[Pair]) -> str:
    """The median bandwidth of each class, for the report's line."""
    shown = []
    for cross, name in ((False, "within a node"), (True, "across nodes")):
        values = [p.gbps for p in found if p.cross is cross]
        if values:
            shown.append(f"{len(values)} pair(s) {name}, median {statistics.median(values):.2f} GB/s")
    return "; ".join(shown)
