"""Preflight: check first, train later. Every pod, every rank, before any data or model is loaded.

It runs inside the training processes, right after the process group exists (session.py calls it once the Trainer's
arguments have joined the group): one rendezvous instead of two, and the checks see exactly the environment training
will (CANN sourced by run.sh, the visible devices, the collective library and its settings). A separate torchrun
would pay HCCL/NCCL initialisation twice and could pass on a communicator training never uses.

The checks (``recipe.yaml`` ``operations.preflight`` holds every threshold, computed by recipekit.memory.operations):

* **devices**: the pod sees as many devices as it runs processes (``ops.testing.device_count`` simulates another
  count), each healthy (``npu-smi info`` on Ascend) and held by no other process (device memory in use that this
  process did not allocate: the stale-process failure that makes HCCL's initialisation fail); skipped on CPU;
* **versions**: torch, torch_npu, transformers, DeepSpeed, CANN, the Ascend driver and firmware, CUDA, NCCL and the
  NVIDIA driver equal on every pod (gathered over torch.distributed as JSON text, compared by every rank alike) — a
  difference fails; a difference from the image's pins only warns (the Job may run another image than this bundle's);
* **storage**: the output directory exists (created if missing), every pod can write a marker there that every other
  pod reads (one shared volume, not a pod-local directory), and it has room for the configured checkpoints;
* **allreduce**: an all-reduce at each configured message size over all ranks, as nccl-tests/hccl_test measure it:
  algorithm bandwidth = bytes / time, bus bandwidth = algbw × 2(n−1)/n (the link traffic a ring all-reduce needs,
  comparable with the link's rating); below ``bandwidth_warn_gbps`` is a warning; not finishing within the preflight
  timeout is a failure with the bundle README's collective hints (the watchdog thread ends the process: a hung
  collective cannot be interrupted);
* **throughput**: the shared volume's sequential write and read rate and the time a checkpoint of this plan takes
  (volumeprobe.py);
* **p2p**: every pair of ranks timed alone, which names the slow node or link (p2p.py);
* **burnin**: opt-in (``ops.burn_in_s``), minutes of matmuls and all-reduces with a verdict per node (burnin.py).

``mode`` (``ops.preflight``) decides what a warning does: ``warn`` logs it and trains; ``strict`` ends the Job before
training with :class:`PreflightGate` (``exitcodes.EXIT_PREFLIGHT_GATE``, TerminateJob): a restart would measure the
same slow part again.

Every rank gathers every pod's findings and reaches the same verdict, so all ranks stop together (none is left
waiting in a collective). Rank 0 writes the cluster check report (``cluster-check.json``) into the output directory,
a table into the log, and a ``preflight`` record into metrics.jsonl. A failed check raises :class:`PreflightFailed`:
train.py prints its one-line reason and exits ``exitcodes.EXIT_PREFLIGHT``; no training starts. What pods send each
other is JSON text (:func:`_gather`): a peer's record is parsed, never unpickled beyond torch's own collective.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ...boundary import exitcodes, filenames, jsonfile, metricslog
from ...boundary.common import LOG, RunError
from ..watchdog import Watchdog
from . import burnin, p2p, volumeprobe
from .nodefacts import (
    GIB,
    device_facts,
    local_rank,
    pod_index,
    public,
    software_versions,
)

#: Device memory another process may legitimately leave in use before this one counts as "held" (driver, firmware).
HELD_SLACK_GIB = 1.0
#: Warm-up all-reduces per size before timing.
WARMUP = 2
PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
CHECKS = filenames.PREFLIGHT_CHECKS


class PreflightFailed(RunError):
    """A check failed: one line, exit ``exitcodes.EXIT_PREFLIGHT``."""

    code = exitcodes.EXIT_PREFLIGHT


class PreflightGate(RunError):
    """``ops.preflight: strict`` and a check warned: one line, exit ``exitcodes.EXIT_PREFLIGHT_GATE``."""

    code = exitcodes.EXIT_PREFLIGHT_GATE


def storage_write(output_dir: Path, pod: int, token: str) -> dict[str, Any]:
    """Create the output directory if needed and write this pod's marker into it; the marker's path or the error."""
    marker = output_dir / filenames.PREFLIGHT_DIR / f"pod-{pod}.{token}"
    try:
        if output_dir.exists() and not output_dir.is_dir():
            return {"error": f"{output_dir} is not a directory"}
        jsonfile.replace_text(marker, f"{pod}\n")
    except OSError as exc:
        return {"error": f"cannot write to {output_dir}: {exc.strerror or exc}"}
    usage = shutil.disk_usage(output_dir)
    return {"marker": str(marker), "free_bytes": usage.free}


def make_output_dir(output_dir: Path) -> None:
    """Create the output directory before anything else needs it (the resume choice, the prepared data): a path
    no pod can create fails here as the storage check would, in one line, not as a traceback from the data step."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PreflightFailed(
            f"preflight failed: storage: pod {pod_index()}: cannot write to {output_dir}: {exc.strerror or exc} "
            "(cluster.output_dir must be a directory on the shared volume)"
        ) from None


def storage_read(output_dir: Path, pods: int, token: str) -> list[int]:
    """The pods whose marker this pod cannot see."""
    base = output_dir / filenames.PREFLIGHT_DIR
    return [pod for pod in range(pods) if not (base / f"pod-{pod}.{token}").is_file()]


# ------------------------------------------------------------------------------------------------------ verdicts
def check(name: str, status: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {"check": name, "status": status, "detail": detail, **extra}


def judge_devices(facts: list[dict[str, Any]], expected: int) -> dict[str, Any]:
    """Every pod sees ``expected`` devices (one per process it starts), healthy and free."""
    first = facts[0]
    if first["kind"] not in ("npu", "cuda") and not any(f["simulated"] for f in facts):
        return check("devices", SKIP, f"{first['kind']}: no accelerator to check")
    problems = []
    for rank, fact in enumerate(facts):
        pod = fact["pod"]
        if fact["visible"] != expected:
            what = " (simulated: ops.testing.device_count)" if fact["simulated"] else ""
            problems.append(
                f"pod {pod} (rank {rank}) sees {fact['visible']} {fact['kind']} device(s), the bundle starts "
                f"{expected} process(es) per pod{what}"
            )
        if fact.get("memory_error"):
            problems.append(f"pod {pod} rank {rank}: device memory query failed: {fact['memory_error']}")
        held = fact.get("held_by_others_gib")
        if isinstance(held, (int, float)) and held > HELD_SLACK_GIB:
            problems.append(
                f"pod {pod} {fact['kind']}:{fact['device']} has {held:.1f} GiB in use by another process (a stale "
                "run?): free the device or restart the pod on another node"
            )
        health = fact.get("health") or {}
        if health.get("error"):
            problems.append(f"pod {pod}: {health['error']}")
        for npu, state in health.get("npus", []):
            if state != "OK":
                problems.append(f"pod {pod}: npu-smi reports NPU {npu} health {state}")
    if problems:
        return check("devices", FAIL, "; ".join(dict.fromkeys(problems)))
    notes = {fact["health"]["skipped"] for fact in facts if (fact.get("health") or {}).get("skipped")}
    detail = f"{expected} {first['kind']} device(s) per pod, free" + (f" ({'; '.join(notes)})" if notes else "")
    counted = [
        f"pod {fact['pod']} GPU {gpu}: {name} {value}"
        for fact in facts
        for gpu, name, value in (fact.get("health") or {}).get("counters", [])
    ]
    if counted:
        return check("devices", WARN, f"{detail}; error counters above zero: {'; '.join(counted)}")
    return check("devices", PASS, detail)


def judge_versions(facts: list[dict[str, Any]], expected: dict[str, str]) -> dict[str, Any]:
    """Equal on every pod (else fail); as the image pins them (else warn)."""
    keys = sorted({key for fact in facts for key in fact})
    differ = {}
    for key in keys:
        values = {fact.get(key, "absent") for fact in facts}
        if len(values) > 1:
            by_pod = {f"pod {fact['pod']}": fact.get(key, "absent") for fact in facts}
            differ[key] = by_pod
    differ.pop("pod", None)
    mine = facts[0]
    if differ:
        text = "; ".join(f"{key}: {', '.join(f'{p} {v}' for p, v in pods.items())}" for key, pods in differ.items())
        return check("versions", FAIL, f"pods run different software: {text}", differ=differ)
    off = {
        name: (mine.get(name, "absent"), want)
        for name, want in expected.items()
        if public(str(mine.get(name, "absent"))) != public(str(want))
    }
    shown = ", ".join(f"{k} {v}" for k, v in mine.items() if k not in ("pod", "python"))
    if off:
        text = ", ".join(f"{name} {have} (image pins {want})" for name, (have, want) in off.items())
        return check("versions", WARN, f"equal on every pod, but {text}: the Job may run another image", versions=mine)
    return check("versions", PASS, f"equal on every pod: {shown}", versions=mine)


def judge_storage(
    writes: list[dict[str, Any]], unseen: list[list[int]], output_dir: Path, needed: int
) -> dict[str, Any]:
    """Every pod wrote its marker, saw every other pod's, and the volume has room for the checkpoints."""
    problems = [f"pod {w['pod']}: {w['error']}" for w in writes if w.get("error")]
    for w, missing in zip(writes, unseen):
        if missing and not w.get("error"):
            problems.append(
                f"pod {w['pod']} cannot see the markers of pod(s) {', '.join(map(str, missing))} in {output_dir}: "
                "the pods do not share one volume (check the PVC and its access mode: ReadWriteMany)"
            )
    free = min((w["free_bytes"] for w in writes if "free_bytes" in w), default=0)
    if not problems and free < needed:
        problems.append(
            f"{output_dir} has {free / GIB:.1f} GiB free, the checkpoints and the final model need "
            f"{needed / GIB:.1f} GiB (train.save_total_limit + 1 checkpoints): free space or lower save_total_limit"
        )
    if problems:
        return check("storage", FAIL, "; ".join(dict.fromkeys(problems)))
    return check(
        "storage",
        PASS,
        f"{output_dir} writable and shared by {len(writes)} pod(s); {free / GIB:.1f} GiB free, "
        f"{needed / GIB:.2f} GiB needed",
        free_bytes=free,
        needed_bytes=needed,
    )


def bus_bandwidth(algbw: float, world: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: algbw × 2(n−1)/n."""
    return algbw * 2 * (world - 1) / world if world > 1 else 0.0


def judge_bandwidth(results: list[dict[str, Any]], world: int, settings: dict[str, Any]) -> dict[str, Any]:
    if world < 2:
        return check("allreduce", SKIP, "one rank: no collective to measure")
    shown = "; ".join(f"{r['size_mb']:g} MB {r['algbw_gbps']:.2f}/{r['busbw_gbps']:.2f} GB/s" for r in results)
    largest = max(results, key=lambda r: r["size_mb"])
    floor = float(settings["bandwidth_warn_gbps"])
    detail = f"algbw/busbw {shown}"
    if largest["busbw_gbps"] < floor:
        return check(
            "allreduce",
            WARN,
            f"{detail}; bus bandwidth {largest['busbw_gbps']:.2f} GB/s at {largest['size_mb']:g} MB is below "
            f"{floor:.2f} GB/s ({settings['link']} {settings['link_gbps']:g} GB/s × ops.bandwidth_warn_fraction)",
            results=results,
        )
    return check("allreduce", PASS, f"{detail} (floor {floor:.2f} GB/s)", results=results)


# ------------------------------------------------------------------------------------------------- collectives
def _grouped() -> bool:
    """Whether a process group exists (a run started without torchrun trains as one process, without one)."""
    return dist.is_available() and dist.is_initialized()


#: Characters of one rank's gathered record at most.
GATHER_MAX = 1024 * 1024


def _gather(value: Any) -> list[Any]:
    """Every rank's ``value``, sent as JSON text: what a peer sends is parsed as JSON, bounded, never unpickled
    beyond torch's own collective (which carries a str)."""
    if not _grouped():
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, json.dumps(value))
    parsed = []
    for rank, text in enumerate(out):
        try:
            if not isinstance(text, str) or len(text) > GATHER_MAX:
                raise ValueError(type(text).__name__)
            parsed.append(json.loads(text))
        except ValueError:
            raise PreflightFailed(f"preflight failed: rank {rank} sent a malformed record (not JSON text)") from None
    return parsed


def _barrier() -> None:
    if _grouped():
        dist.barrier()


def measure_allreduce(sizes_mb: list[float], iterations: int, device: torch.device) -> list[dict[str, Any]]:
    """Time ``iterations`` all-reduces of each size (float32) after warm-ups; the slowest rank's time counts."""
    world = dist.get_world_size()
    results = []
    for size in sizes_mb:
        count = max(1, int(size * 1e6) // 4)
        tensor = torch.ones(count, dtype=torch.float32, device=device)
        for _ in range(WARMUP):
            dist.all_reduce(tensor)
        _synchronize(device)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(tensor)
        _synchronize(device)
        elapsed = torch.tensor([(time.perf_counter() - start) / iterations], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        seconds = float(elapsed.item())
        algbw = count * 4 / seconds / 1e9 if seconds > 0 else 0.0
        results.append(
            {
                "size_mb": size,
                "bytes": count * 4,
                "time_us": round(seconds * 1e6, 1),
                "algbw_gbps": round(algbw, 3),
                "busbw_gbps": round(bus_bandwidth(algbw, world), 3),
            }
        )
        del tensor
    return results


def _synchronize(device: torch.device) -> None:
    if device.type in ("cuda", "npu"):
        getattr(torch, device.type).synchronize(device)


# ----------------------------------------------------------------------------- finding the slow part (gateable)
def measure_throughput(output_dir: Path, pod: int, size_mb: int, first_on_pod: bool) -> list[dict[str, Any]]:
    """Every pod writes at once, then reads at once (volumeprobe.py); each pod's figures, gathered."""
    folder = output_dir / filenames.PREFLIGHT_DIR
    probe = volumeprobe.write_probe(folder, pod, size_mb) if first_on_pod else None
    _barrier()  # every pod has written before any reads: the reads hit the volume, not a neighbour's write
    if probe is not None and not probe.get("error"):
        probe.update(volumeprobe.read_probe(probe))
    probes = _gather({"pod": pod, **probe} if probe is not None else None)
    return [p for p in probes if p is not None]


def judge_throughput(probes: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    found = volumeprobe.judge(
        probes,
        int(settings["checkpoint_bytes"]),
        float(settings["checkpoint_save_limit_s"]),
        float(settings["p2p_slow_fraction"]),
    )
    figures = {k: found[k] for k in ("write_mbps", "read_mbps", "checkpoint_s") if k in found}
    if found["problems"]:
        return check("throughput", WARN, "; ".join(found["problems"]) + f" ({found['detail']})", **figures)
    return check("throughput", PASS, found["detail"], **figures)


def judge_p2p(
    times: list[dict[str, float]], pods: list[int], hosts: list[str], settings: dict[str, Any], kind: str
) -> dict[str, Any]:
    size = max(1, int(float(settings["p2p_size_mb"]) * 1e6) // 4) * 4
    found = p2p.pairs(times, pods, size)
    if not found:
        return check("p2p", SKIP, "one rank: no pair to measure")
    floor = float(settings["bandwidth_warn_gbps"]) if kind in ("cuda", "npu") else None
    slow = p2p.slow_pairs(found, float(settings["p2p_slow_fraction"]), floor, len(set(pods)) > 1)
    bad, links = p2p.verdict(found, slow, hosts)
    matrix = [[p.a, p.b, p.gbps] for p in found]
    shown = f"{p2p.summary(found)} ({float(settings['p2p_size_mb']):g} MB each way)"
    if bad or links:
        return check(
            "p2p",
            WARN,
            f"{p2p.describe(found, bad, links, pods, hosts)}; {shown}",
            matrix=matrix,
            slow_pods=sorted({pods[r] for r in bad}),
        )
    return check("p2p", PASS, f"no slow node or link: {shown}", matrix=matrix, slow_pods=[])


def judge_burnin(results: list[dict[str, Any]], pods: list[int], hosts: list[str], settings: dict[str, Any], kind: str):
    bar = float(settings["burn_in_tflops"]) if kind in ("cuda", "npu") else None
    verdicts, problems = burnin.judge(results, pods, hosts, float(settings["burn_in_slow_fraction"]), bar)
    shown = ", ".join(f"pod {v['pod']} {v['tflops']:.3g} TFLOP/s {v['verdict']}" for v in verdicts)
    detail = f"{int(settings['burn_in_s'])} s of matmuls and all-reduces: {shown}"
    if problems:
        return check("burnin", WARN, "; ".join(problems) + f" ({detail})", nodes=verdicts)
    return check("burnin", PASS, detail, nodes=verdicts)


def gateable(
    settings: dict[str, Any], world: int, torch_device: torch.device, kind: str, where: dict[str, Any]
) -> list[dict[str, Any]]:
    """The checks that find the slow part: the volume's throughput, the pairs, the burn-in (opt-in)."""
    rank, pod, first = where["rank"], where["pod"], where["first_on_pod"]
    delay = p2p.slow_delay(rank)
    probes = measure_throughput(where["output_dir"], pod, int(settings["storage_probe_mb"]), first)
    checks = [judge_throughput(probes, settings)]
    if world < 2:
        checks.append(check("p2p", SKIP, "one rank: no pair to measure"))
    else:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
        offsets = p2p.rounds(world, local, int(settings["p2p_max_rounds"]))
        mine = p2p.measure(
            offsets, float(settings["p2p_size_mb"]), int(settings["p2p_iterations"]), torch_device, delay
        )
        checks.append(judge_p2p(_gather(mine), where["pods"], where["hosts"], settings, kind))
    seconds = int(settings["burn_in_s"])
    if seconds <= 0:
        checks.append(check("burnin", SKIP, "off (ops.burn_in_s: 0)"))
    elif not _grouped():
        checks.append(check("burnin", SKIP, "one process: no all-reduce to burn in"))
    else:
        results = _gather(burnin.run(float(seconds), torch_device, delay))
        checks.append(judge_burnin(results, where["pods"], where["hosts"], settings, kind))
    return checks


# ------------------------------------------------------------------------------------------------------- the run
def run_preflight(
    settings: dict[str, Any],
    *,
    output_dir: Path,
    device_kind: str,
    device_count: int,
    torch_device: torch.device,
    simulated_devices: int | None,
    runtime_context_gib: float,
    metrics_file: Path,
) -> dict[str, Any]:
    """Run every check on this rank and agree on the verdict with all others; the report, or PreflightFailed."""
    started = time.monotonic()
    world, rank = (dist.get_world_size(), dist.get_rank()) if _grouped() else (1, 0)
    pods = max(1, world // int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    watchdog = Watchdog(output_dir=output_dir, rank=rank, metrics_file=None, code=exitcodes.EXIT_PREFLIGHT, poll_s=0.5)
    timeout = float(settings["timeout_s"])

    def reason(phase: str, waited: float, limit: float) -> str:
        return (
            f"preflight failed: {phase} did not finish within {limit:.0f} s (ops.preflight_timeout_s): a rank or "
            f"a link does not answer; {settings['collective_hint']}"
        )

    # burn-in runs for its own seconds on top of the checks' allowance
    watchdog.arm("the preflight collectives", timeout + float(settings.get("burn_in_s", 0)), 0, reason)
    try:
        token_box = [secrets.token_hex(6) if rank == 0 else None]
        if _grouped():
            dist.broadcast_object_list(token_box, src=0)
        token = str(token_box[0])
        pod = pod_index()
        first_on_pod = local_rank() == 0
        mine: dict[str, Any] = {
            "pod": pod,
            "host": socket.gethostname()[:64],
            "devices": {
                "pod": pod,
                **device_facts(device_kind, device_count, simulated_devices, runtime_context_gib),
            },
            "versions": {"pod": pod, **software_versions(device_kind)},
            "write": {"pod": pod, **storage_write(output_dir, pod, token)} if first_on_pod else None,
        }
        facts = _gather(mine)
        writes = [f["write"] for f in facts if f["write"] is not None]
        unseen = storage_read(output_dir, pods, token) if first_on_pod and not mine["write"].get("error") else []
        seen = [u for u in _gather(unseen if first_on_pod else None) if u is not None]
        checks = [
            judge_devices([f["devices"] for f in facts], int(settings["devices_per_pod"])),
            judge_versions([f["versions"] for f in facts], dict(settings["expected_versions"])),
            judge_storage(writes, seen, output_dir, int(settings["storage_needed_bytes"])),
        ]
        _barrier()  # every pod has read every marker
        if first_on_pod and mine["write"].get("marker"):
            _remove(Path(mine["write"]["marker"]))
        if any(c["status"] == FAIL for c in checks):
            checks += [check(name, SKIP, "not run: an earlier check failed") for name in CHECKS[len(checks) :]]
        else:
            where = {
                "rank": rank,
                "pod": pod,
                "first_on_pod": first_on_pod,
                "output_dir": output_dir,
                "pods": [int(f["pod"]) for f in facts],
                "hosts": [str(f["host"]) for f in facts],
            }
            checks += _collective_checks(settings, world, torch_device, device_kind, where)
    finally:
        watchdog.disarm()
    report = {
        "ok": not any(c["status"] == FAIL for c in checks),
        "world_size": world,
        "pods": pods,
        "seconds": round(time.monotonic() - started, 2),
        "checks": checks,
    }
    return _verdict(report, settings, rank, output_dir, metrics_file)


def _collective_checks(
    settings: dict[str, Any], world: int, torch_device: torch.device, device_kind: str, where: dict[str, Any]
) -> list[dict[str, Any]]:
    """The checks that run collectives over every rank (the all-reduce, then the gateable measurements), once the
    node checks passed."""
    found = gateable(settings, world, torch_device, device_kind, where)
    if world < 2:
        found.insert(1, check("allreduce", SKIP, "one rank: no collective to measure"))
    else:
        results = measure_allreduce(
            [float(s) for s in settings["allreduce_sizes_mb"]],
            int(settings["allreduce_iterations"]),
            torch_device,
        )
        found.insert(1, judge_bandwidth(results, world, settings))
    return found


def _verdict(
    report: dict[str, Any], settings: dict[str, Any], rank: int, output_dir: Path, metrics_file: Path
) -> dict[str, Any]:
    """The verdict every rank reaches alike: a failed check raises PreflightFailed; under ``strict`` a warning
    raises PreflightGate; rank 0 publishes the report first."""
    checks = report["checks"]
    failed = [c for c in checks if c["status"] == FAIL]
    strict = settings.get("mode") == "strict"
    gated = [c for c in checks if c["status"] == WARN] if strict and not failed else []
    report["mode"] = settings.get("mode", "warn")
    report["gated"] = bool(gated)
    report["ok"] = not failed and not gated
    report["reason"] = "; ".join(f"{c['check']}: {c['detail']}" for c in failed + gated) or None
    if rank == 0:
        _publish(report, output_dir, metrics_file)
    if failed:
        raise PreflightFailed(f"preflight failed: {report['reason']}")
    if gated:
        raise PreflightGate(f"preflight failed (ops.preflight: strict): {report['reason']}")
    return report


def _remove(path: Path) -> None:
    try:
        jsonfile.remove(path)
    except OSError:
        pass


def table(report: dict[str, Any]) -> list[str]:
    """The report as log lines: one per check."""
    width = max(len(name) for name in CHECKS)
    lines = [f"cluster check: {report['pods']} pod(s), world size {report['world_size']}, {report['seconds']} s"]
    lines += [f"  {c['check']:<{width}}  {c['status']:<4}  {c['detail']}" for c in report["checks"]]
    return lines


def _publish(report: dict[str, Any], output_dir: Path, metrics_file: Path) -> None:
    """Rank 0: the table in the log, cluster-check.json and the ``preflight`` record (best effort: an output
    directory that cannot be written is itself the failure the report names)."""
    for line in table(report):
        LOG.info(line) if report["ok"] else LOG.error(line)
    try:
        jsonfile.replace_text(output_dir / filenames.CLUSTER_CHECK_FILE, json.dumps(report, indent=2) + "\n")
        metricslog.append_record(
            metrics_file,
            metricslog.event(
                metricslog.EVENT_PREFLIGHT,
                ok=report["ok"],
                mode=report["mode"],
                gated=report["gated"],
                checks=[{k: c[k] for k in ("check", "status", "detail")} for c in report["checks"]],
                seconds=report["seconds"],
                reason=report["reason"],
                report=str(output_dir / filenames.CLUSTER_CHECK_FILE),
            ),
        )
    except OSError as exc:
        LOG.error("cannot write the cluster check report into %s: %s", output_dir, exc)
