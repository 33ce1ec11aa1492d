"""Judging the operations layer in a dry run: preflight, the metrics endpoint, the profiler window, and a fault the
recipe injects (``ops.testing``): a stall the hang watchdog must catch, a NaN loss the loss guard must stop on.

Like :mod:`recipekit.validate.dryrun.judges.training`, everything here is a pure function of what was observed — the
runtime's structured records in metrics.jsonl (``preflight``, ``stalled``, ``nonfinite``, ``profile``, ``start``), a
scrape of the endpoint, and the files in the output directory — never log text. A fault is judged like ``--kill-pod``:
the job must fail, be restarted as Volcano's RestartJob does, and resume from the newest complete checkpoint (the
runtime contract's rule); the time from the fault to the first step after the restart is the MTTR.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipekit.runtime.boundary import filenames, metricslog
from recipekit.validate.dryrun.cluster.attemptlog import Attempt, exits_in_words
from recipekit.validate.dryrun.cluster.scrape import expected_metric_names, missing_names
from recipekit.validate.dryrun.judges.training import judge_recorded_recovery, resumed_step
from recipekit.validate.shared import controller
from recipekit.validate.shared.results import Result

WHERE = "<dry run>"


@dataclass(frozen=True)
class OpsExpectation:
    """What the work copy's recipe.yaml asks of the operations layer."""

    preflight: bool
    metrics: bool
    device: str
    stall_at: int | None
    stall_rank: int
    nan_at: int | None
    profile_steps: tuple[int, int] | None
    stall_timeout_s: float | None
    #: ops.testing's one-pod faults that the Job's policies answer (device_count_pod, user_error_pod)
    device_count_pod: int | None = None
    user_error_pod: int | None = None
    #: ops.nonfinite_loss: what the Job does on the injected NaN (stop: TerminateJob; skip: RestartJob, batch skipped)
    nonfinite_loss: str = "stop"

    @classmethod
    def from_doc(cls, doc: dict[str, Any] | None, device: str) -> OpsExpectation:
        doc = doc or {}
        ops = doc.get("operations") or {}
        testing = ops.get("testing") or {}
        steps = ((doc.get("recipe") or {}).get("train") or {}).get("profile_steps")
        return cls(
            preflight=bool((ops.get("preflight") or {}).get("enabled")),
            metrics=bool((ops.get("metrics") or {}).get("ports")),
            device=device,
            stall_at=testing.get("stall_at_step"),
            stall_rank=int(testing.get("stall_rank") or 0),
            nan_at=testing.get("nan_at_step"),
            profile_steps=tuple(steps) if steps else None,
            stall_timeout_s=(ops.get("watchdog") or {}).get("stall_timeout_s"),
            device_count_pod=testing.get("device_count_pod") if testing.get("device_count") is not None else None,
            user_error_pod=testing.get("user_error_pod"),
            nonfinite_loss=controller.nonfinite_mode(doc),
        )

    @property
    def fault(self) -> str | None:
        """The fault the first attempt injects: ``stall``, ``nonfinite``, or a one-pod ``user_error`` /
        ``preflight`` failure that the Job's exitCode policies answer."""
        if self.user_error_pod is not None:
            return "user_error"
        if self.device_count_pod is not None:
            return "preflight"
        return "stall" if self.stall_at is not None else "nonfinite" if self.nan_at is not None else None


# -------------------------------------------------------------------------------------------------- preflight
def judge_preflight(result: Result, attempt: Attempt) -> bool:
    """The ``preflight`` record of ``attempt``: present, listing every check, and its verdict. A failed preflight is
    a failed result with its reason, and then no training may have started. Returns whether preflight passed."""
    record = attempt.last(metricslog.EVENT_PREFLIGHT)
    started = attempt.last(metricslog.EVENT_START) is not None or bool(attempt.steps)
    result.details["training_started"] = started
    if record is None:
        result.fail(
            WHERE,
            filenames.METRICS_FILE,
            f"attempt {attempt.number}: no {metricslog.EVENT_PREFLIGHT!r} record"
            + (" although training started" if started else " (the pods' log tails show why)"),
        )
        return False
    checks = {c.get("check"): c for c in record.get("checks") or []}
    result.details.update(
        checks=list(checks.values()), seconds=record.get("seconds"), report=record.get("report"), ok=record.get("ok")
    )
    missing = [name for name in filenames.PREFLIGHT_CHECKS if name not in checks]
    if missing:
        result.fail(WHERE, filenames.CLUSTER_CHECK_FILE, f"the report lacks check(s) {', '.join(missing)}")
    report = Path(str(record.get("report") or ""))
    if record.get("report") and not report.is_file():
        result.fail(WHERE, filenames.CLUSTER_CHECK_FILE, f"{report} was not written")
    if not record.get("ok"):
        result.fail(WHERE, "preflight", f"preflight failed: {record.get('reason')}")
        if started:
            result.fail(WHERE, "preflight", "training started although preflight failed")
        return False
    if result.failed:
        return False
    result.reason = (
        f"{record.get('seconds')} s: "
        + "; ".join(f"{name} {c.get('status')}" for name, c in checks.items())
        + _bandwidth_words(report)
    )
    return True


def _bandwidth_words(report: Path) -> str:
    try:
        import json

        checks = json.loads(report.read_text(encoding="utf-8")).get("checks", [])
    except (OSError, ValueError):
        return ""
    for c in checks:
        if c.get("check") == "allreduce" and c.get("results"):
            best = max(c["results"], key=lambda r: r["size_mb"])
            return (
                f" (all-reduce {best['size_mb']:g} MB: algbw {best['algbw_gbps']} GB/s, "
                f"busbw {best['busbw_gbps']} GB/s)"
            )
    return ""


# ---------------------------------------------------------------------------------------------------- metrics
def judge_metrics(result: Result, attempts: list[Attempt]) -> None:
    """Every pod's endpoint (the first process of each; rank 0 alone with ``ops.metrics_ranks: rank0``) served every
    metric name, with values, while training ran: the first attempt's settled read (:meth:`DryRun._scrape`), else
    the first that every pod answered, else the first error."""
    reads = [a.scraped for a in attempts if a.scraped]
    good = [read for read in reads if not read.get("error")]
    scraped = next((read for read in good if read.get("settled")), None) or next(iter(good + reads), None)
    if scraped is None:
        result.fail(WHERE, "metrics", "the endpoints were never read: training ended before the first checkpoint")
        return
    result.details["scraped"] = scraped
    if scraped.get("error"):
        result.fail(WHERE, "metrics", scraped["error"])
        return
    want_declared, want_sampled = expected_metric_names()
    for pod, found in sorted(scraped["pods"].items()):
        missing, unsampled = missing_names(pod, found)
        if missing:
            result.fail(WHERE, "metrics", f"pod {pod} (port {found['port']}) does not serve {', '.join(missing)}")
        if unsampled:
            result.fail(
                WHERE,
                "metrics",
                f"pod {pod} served without a value at step {scraped.get('step')}: {', '.join(unsampled)}",
            )
    if not result.failed:
        ports = ", ".join(str(found["port"]) for _, found in sorted(scraped["pods"].items()))
        result.reason = (
            f"{len(scraped['pods'])} endpoint(s) (ports {ports}) served all {len(want_declared)} metric names at "
            f"step {scraped.get('step')}, {len(want_sampled)} with values"
        )


# ---------------------------------------------------------------------------------------------------- profile
def judge_profile(result: Result, output_dir: Path, steps: tuple[int, int], attempts: list[Attempt]) -> None:
    where = output_dir / filenames.PROFILE_DIR / f"steps-{steps[0]}-{steps[1]}"
    traces = sorted(p for p in where.rglob("*") if p.is_file()) if where.is_dir() else []
    records = [r for a in attempts for r in a.events(metricslog.EVENT_PROFILE)]
    result.details.update(traces=[str(p) for p in traces], records=records)
    if not traces:
        result.fail(WHERE, filenames.PROFILE_DIR, f"no trace in {where}")
    elif not any(p.stat().st_size for p in traces):
        result.fail(WHERE, filenames.PROFILE_DIR, f"the traces in {where} are empty")
    if not records:
        result.fail(WHERE, filenames.METRICS_FILE, f"no {metricslog.EVENT_PROFILE!r} record")
    if not result.failed:
        size = sum(p.stat().st_size for p in traces)
        result.reason = f"steps {steps[0]}-{steps[1]} traced: {len(traces)} file(s), {size / 1e6:.1f} MB in {where}"


# ----------------------------------------------------------------------------------------------------- faults
def judge_fault(
    result: Result,
    kind: str,
    expect: OpsExpectation,
    first: Attempt,
    second: Attempt | None,
    expected: int | None,
    output_dir: Path | None = None,
) -> None:
    """The injected fault was noticed as it should be, the job failed, and the restart resumed from ``expected``."""
    if kind == "stall":
        noticed_at = _judge_stall(result, expect, first)
    else:
        noticed_at = _judge_nonfinite(result, expect, first)
    if first.outcome != "failed":
        result.fail(
            WHERE,
            "exit codes",
            f"the first attempt {first.outcome} instead of failing ({exits_in_words(first.exit_codes)})",
        )
    if second is None or result.failed:
        return
    _judge_restart(result, first, second, expected, noticed_at, output_dir)
    if result.failed:
        return
    d = result.details
    what = (
        f"rank {expect.stall_rank} stalled at step {expect.stall_at}; the watchdogs of rank(s) "
        f"{', '.join(map(str, d['stalled_ranks']))} detected it after {d['detection_s']} s (stall timeout "
        f"{d['stall_timeout_s']} s) and dumped their stacks ({len(d['stacks'])} file(s))"
        if kind == "stall"
        else f"loss NaN at step {expect.nan_at}: stopped on every rank, checkpoint-{expect.nan_at} not saved"
    )
    result.reason = (
        f"{what}; restarted and resumed from checkpoint-{d['resumed_step']}; MTTR {d['mttr_s']} s "
        f"(fault → first step after the restart)"
    )


def _judge_stall(result: Result, expect: OpsExpectation, first: Attempt) -> float | None:
    stalled = first.events(metricslog.EVENT_STALLED)
    stacks = [str(r.get("stacks")) for r in stalled if r.get("stacks")]
    present = [s for s in stacks if Path(s).is_file() and "File " in Path(s).read_text(errors="replace")]
    waited = [float(r.get("waited_s") or 0) for r in stalled]
    result.details.update(
        stalled_ranks=sorted({int(r["rank"]) for r in stalled if r.get("rank") is not None}),
        stalled_records=stalled,
        stacks=present,
        detection_s=round(min(waited), 2) if waited else None,
        stall_timeout_s=expect.stall_timeout_s,
        last_step_before=first.steps[-1].step if first.steps else None,
    )
    if not stalled:
        result.fail(WHERE, filenames.METRICS_FILE, f"no {metricslog.EVENT_STALLED!r} record: the hang was not detected")
        return None
    if expect.stall_rank not in result.details["stalled_ranks"]:
        result.fail(WHERE, "watchdog", f"rank {expect.stall_rank} stalled but its watchdog did not report it")
    if not present:
        result.fail(WHERE, filenames.HANG_DIR, f"no stack dump with Python frames: {stacks or 'none written'}")
    if first.steps and first.steps[-1].step >= (expect.stall_at or 0):
        result.fail(WHERE, "steps", f"step {first.steps[-1].step} completed although rank {expect.stall_rank} stalled")
    # The hang began when the last step before it was seen.
    return first.steps[-1].at if first.steps else None


def _judge_nonfinite(result: Result, expect: OpsExpectation, first: Attempt) -> float | None:
    record = first.last(metricslog.EVENT_NONFINITE)
    result.details["nonfinite"] = record
    if record is None:
        result.fail(WHERE, filenames.METRICS_FILE, f"no {metricslog.EVENT_NONFINITE!r} record: the NaN loss went on")
        return None
    if record.get("step") != expect.nan_at:
        result.fail(
            WHERE, "loss guard", f"stopped at step {record.get('step')}, the NaN was injected at {expect.nan_at}"
        )
    if not record.get("message"):
        result.fail(WHERE, "loss guard", "the record carries no message")
    if first.last(metricslog.EVENT_DONE) is not None:
        result.fail(WHERE, "loss guard", "training reported done after a NaN loss")
    at = next((s.at for s in first.steps if s.step == expect.nan_at), None)
    return at if at is not None else (first.steps[-1].at if first.steps else None)


def _judge_restart(
    result: Result,
    first: Attempt,
    second: Attempt,
    expected: int | None,
    noticed_at: float | None,
    output_dir: Path | None = None,
) -> None:
    start = second.last(metricslog.EVENT_START)
    step = resumed_step(start) if start else None
    first_new = second.steps[0] if second.steps else None
    result.details.update(
        expected_resume_step=expected,
        resumed_step=step,
        first_step_after_restart=first_new.step if first_new else None,
        mttr_observed_s=round(first_new.at - noticed_at, 2) if first_new and noticed_at is not None else None,
        teardown_s=round(second.started - first.ended, 2),
        exit_codes=second.exit_codes,
    )
    if second.outcome != "completed":
        result.fail(WHERE, "restart", f"the restarted job {second.outcome} ({exits_in_words(second.exit_codes)})")
        return
    recorded = judge_recorded_recovery(result, output_dir, expected)  # the MTTR `recipekit runs history` prints
    result.details["mttr_s"] = recorded if recorded is not None else result.details["mttr_observed_s"]
    if step != expected:
        result.fail(
            WHERE,
            "resume",
            f"resumed from {start.get('resume_from') if start else 'nothing'}, but the newest complete checkpoint "
            f"was {f'checkpoint-{expected}' if expected is not None else 'none'}",
        )
    if first_new is not None and first_new.step != (expected or 0) + 1:
        result.fail(
            WHERE, "resume", f"the first step after the restart is {first_new.step}, expected {(expected or 0) + 1}"
        )
