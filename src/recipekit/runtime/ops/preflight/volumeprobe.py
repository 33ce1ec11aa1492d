"""Preflight's throughput test of the shared volume: how long a checkpoint of this plan will take to write.

Every pod's first process writes ``storage_probe_mb`` to one new file in the output directory's preflight folder
at the same moment (as ranks write their shards of a checkpoint at once), in 4 MiB blocks, then ``fsync``; after a
barrier each reads its own file back once its pages were dropped from the page cache (``posix_fadvise`` DONTNEED
after the sync, so the read goes to the volume, not to memory). Throughput of the volume = all bytes / the slowest
pod's time; a checkpoint of ``checkpoint_bytes`` (recipekit.memory.operations, the plan's count) takes that many
bytes at that rate. A pod far below the others (``p2p_slow_fraction`` of the median) is named: its mount or its
node's network is the slow part.

The file is created with O_EXCL | O_NOFOLLOW (no write follows a link another tenant planted), read back bounded
by the size written, and removed. Standard library only.
"""

from __future__ import annotations

import os
import secrets
import statistics
import time
from pathlib import Path
from typing import Any

BLOCK = 4 * 1024 * 1024


def write_probe(folder: Path, pod: int, size_mb: int) -> dict[str, Any]:
    """Write and sync this pod's probe file; its path, bytes and seconds, or the error."""
    path = folder / f"throughput-{pod}.{secrets.token_hex(4)}"
    block = os.urandom(BLOCK)  # incompressible: a deduplicating or compressing volume must not flatter itself
    total = size_mb * 1024 * 1024
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        fd = os.open(path, flags, 0o600)
        try:
            written = 0
            while written < total:
                written += os.write(fd, block[: min(BLOCK, total - written)])
            os.fsync(fd)
            seconds = time.perf_counter() - start
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except OSError as exc:
        return {"error": f"cannot write {path.name} in {folder}: {exc.strerror or exc}"}
    return {"path": str(path), "bytes": total, "write_s": seconds}


def read_probe(written: dict[str, Any]) -> dict[str, Any]:
    """Read this pod's probe file back (at most the bytes written), then remove it; the seconds or the error."""
    path, total = Path(written["path"]), int(written["bytes"])
    try:
        start = time.perf_counter()
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            read = 0
            while read < total:
                chunk = os.read(fd, min(BLOCK, total - read))
                if not chunk:
                    break
                read += len(chunk)
        finally:
            os.close(fd)
        seconds = time.perf_counter() - start
    except OSError as exc:
        return {"read_error": f"cannot read {path.name}: {exc.strerror or exc}"}
    finally:
        try:
            path.unlink()
        except OSError:
            pass
    return {"read_s": seconds} if read == total else {"read_error": f"{path.name}: read {read} of {total} bytes"}


def _rate(total: int, seconds: float) -> float:
    return total / seconds / 1e6 if seconds > 0 else 0.0


def judge(probes: list[dict[str, Any]], checkpoint_bytes: int, limit_s: float, fraction: float) -> dict[str, Any]:
    """The volume's write and read throughput (MB/s, every pod at once), the checkpoint's time at that rate, and
    what falls short: a checkpoint slower than ``limit_s``, a pod below ``fraction`` of the median pod."""
    errors = [f"pod {p['pod']}: {p.get('error') or p.get('read_error')}" for p in probes if not _ok(p)]
    if errors:
        return {"problems": errors, "detail": "; ".join(errors)}
    total = sum(int(p["bytes"]) for p in probes)
    write = _rate(total, max(float(p["write_s"]) for p in probes))
    read = _rate(total, max(float(p["read_s"]) for p in probes))
    checkpoint_s = checkpoint_bytes / (write * 1e6) if write > 0 else float("inf")
    found = {
        "write_mbps": round(write, 1),
        "read_mbps": round(read, 1),
        "checkpoint_bytes": checkpoint_bytes,
        "checkpoint_s": round(checkpoint_s, 1),
    }
    problems = []
    if checkpoint_s > limit_s:
        problems.append(
            f"a checkpoint of {checkpoint_bytes / 1024**3:.1f} GiB takes about {checkpoint_s:.0f} s at "
            f"{write:.0f} MB/s, above ops.checkpoint_save_limit_s ({limit_s:.0f} s)"
        )
    if len(probes) > 2:
        rates = {int(p["pod"]): _rate(int(p["bytes"]), float(p["write_s"])) for p in probes}
        middle = statistics.median(rates.values())
        for pod, rate in sorted(rates.items()):
            if rate < fraction * middle:
                problems.append(f"pod {pod} writes at {rate:.0f} MB/s, the median pod at {middle:.0f} MB/s")
    detail = (
        f"write {write:.0f} MB/s, read {read:.0f} MB/s ({len(probes)} pod(s) at once, "
        f"{total / 1e6:.0f} MB); a checkpoint of {checkpoint_bytes / 1024**3:.2f} GiB: about {checkpoint_s:.1f} s"
    )
    return {"problems": problems, "detail": detail, **found}


def _ok(probe: dict[str, Any]) -> bool:
    return not probe.get("error") and not probe.get("read_error") and "read_s" in probe
