"""Synthetic run output directories for the report and compare tests: metrics.jsonl as the runtime writes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from recipekit.runtime.boundary import filenames

#: A plan.json's fields the report reads: 1024 tokens per step on 2 devices in 0.5 s → 1024 tokens/s per device.
PLAN: dict[str, Any] = {
    "layout": {"world_size": 2, "zero_stage": 2, "precision": "bf16"},
    "compute": {"tokens_per_step": 1024, "flops_per_token": 1e9, "peak_tflops": 10.0, "recompute_factor": 1.5},
    "time": {"step_s": 0.5, "total_steps": 8},
    "memory_gib": {"total": 3.0},
}


def losses(steps: int = 8, start: float = 6.0, slope: float = 0.05) -> list[float]:
    return [start - slope * i for i in range(steps)]


def step_record(step: int, loss: float, at: float, **extra: Any) -> dict[str, Any]:
    return {
        "step": step,
        "loss": loss,
        "grad_norm": 2.0 + 0.01 * step,
        "learning_rate": 1e-3,
        "tokens_per_second_per_device": 1000.0,
        "tflops_per_device": 1.0,
        "mfu": 0.1,
        "hfu": 0.15,
        "step_time_s": 0.55,
        "dataloader_wait_fraction": 0.1,
        "time": at,
        **extra,
    }


def write_run(
    path: Path,
    values: list[float],
    *,
    kill_after: int | None = None,
    resume_step: int = 4,
    downtime: float = 30.0,
    evals: dict[int, float] | None = None,
    extra_lines: list[str] = (),  # type: ignore[assignment]
) -> Path:
    """An output directory whose metrics.jsonl logs ``values`` as steps 1..N, one second apart; with ``kill_after``
    the first attempt stops after that step and a second attempt resumes at ``resume_step`` ``downtime`` s later."""
    path.mkdir(parents=True, exist_ok=True)
    at = 1000.0
    records: list[dict[str, Any]] = [
        {"event": "preflight", "ok": True, "checks": [], "time": at},
        {"event": "start", "run_id": "abc123", "world_size": 2, "device": "cpu", "precision": "bf16",
         "zero_stage": 2, "resume_from": None, "resume_step": None, "time": at},
    ]  # fmt: skip
    last = len(values) if kill_after is None else kill_after
    for step in range(1, last + 1):
        at += 1
        records.append(step_record(step, values[step - 1], at))
        if step % 4 == 0:
            records.append({"event": "checkpoint", "step": step, "seconds": 0.2, "bytes": 2**21, "time": at})
        if evals and step in evals:
            records.append({"step": step, "eval_loss": evals[step], "time": at})
    if kill_after is not None:
        # the restarted pods prepare data and check the cluster before train.py's start record
        records.append({"event": "data", "reused": True, "time": at + downtime / 2})
        records.append({"event": "preflight", "ok": True, "checks": [], "time": at + downtime - 1})
        at += downtime
        records.append(
            {"event": "start", "run_id": "abc123", "world_size": 2, "resume_step": resume_step,
             "resume_from": f"/out/checkpoint-{resume_step}", "time": at}
        )  # fmt: skip
        for step in range(resume_step + 1, len(values) + 1):
            at += 1
            records.append(step_record(step, values[step - 1], at))
            if step % 4 == 0:
                records.append({"event": "checkpoint", "step": step, "seconds": 0.3, "bytes": 2**21, "time": at})
    records.append({"step": len(values), "train_runtime": 9.0, "train_loss": 5.8, "time": at})
    records.append({"event": "done", "step": len(values), "output": str(path), "time": at})
    lines = [json.dumps(r) for r in records] + list(extra_lines)
    (path / filenames.METRICS_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
    (path / filenames.RUN_FILE).write_text(json.dumps({"run_id": "abc123", "world_size": 2, "zero_stage": 2}))
    results = [
        {"size_mb": 1.0, "algbw_gbps": 0.5, "busbw_gbps": 0.5},
        {"size_mb": 4.0, "algbw_gbps": 0.9, "busbw_gbps": 0.9},
    ]
    check = {"ok": True, "checks": [{"check": "allreduce", "status": "pass", "results": results}]}
    (path / filenames.CLUSTER_CHECK_FILE).write_text(json.dumps(check))
    return path


def write_plan(path: Path, plan: dict[str, Any] = PLAN) -> Path:
    path.write_text(json.dumps(plan), encoding="utf-8")
    return path
