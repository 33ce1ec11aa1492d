"""The report's first table, as rows of text: what ran, how it went, what deviated from the plan.

Pure functions of a :class:`~recipekit.runs.runlog.RunLog`: the terminal (rich), the HTML page and ``--json`` all show
these same rows, so the three views cannot disagree.
"""

from __future__ import annotations

from typing import Any

from recipekit.runs.evaluation import eval_json, eval_rows
from recipekit.runs.runlog import Restart, RunLog
from recipekit.runs.runplan import Row, deviations, rows

#: The versions the summary names (the manifest pins more; --json has them all).
_KEY_VERSIONS = ("torch", "torch_npu", "transformers", "deepspeed", "cann", "pods:torch", "pods:deepspeed")


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} s"


def mttr_text(value: float | None) -> str:
    """An MTTR as every command prints it: the runtime's figure (recovery.py, rounded to 0.01 s), two decimals."""
    return "n/a" if value is None else f"{value:.2f} s"


def recoveries(run: RunLog) -> dict[int, float | None]:
    """The MTTR of each recovery in the run's recovery.jsonl, by the step the interrupted attempt had reached: the
    runtime's one definition (last step before the interruption → first step after the restart), which ``runs
    history`` and the dry run's judge print too. Empty for a run without the file (an older bundle, a baseline)."""
    if run.output_dir is None:
        return {}
    from recipekit.runtime.volume import recovery

    try:
        found = recovery.history(recovery.read(run.output_dir))
    except (OSError, ValueError, TypeError, KeyError):
        return {}
    return {r.interrupted_step: r.mttr_s for r in found}


def what_ran(run: RunLog) -> list[tuple[str, str]]:
    start, manifest, plan = run.start or {}, run.manifest or {}, run.plan or {}
    layout = plan.get("layout") or {}
    name = manifest.get("name") or (run.run_record or {}).get("recipe") or "(unknown)"
    versions = run.versions
    found = [
        ("recipe", str(name)),
        ("recipe digest", (run.recipe_digest or "(no bundle)")[:16]),
        ("run id", str(start.get("run_id") or (run.run_record or {}).get("run_id") or "(unknown)")),
        ("image", run.image or "(no bundle)"),
        (
            "world",
            f"{start.get('world_size', layout.get('world_size', '?'))} processes on {start.get('device', '?')}, "
            f"{start.get('precision', layout.get('precision', '?'))}, "
            f"ZeRO {start.get('zero_stage', layout.get('zero_stage', '?'))}"
            + (f", TP {start['tensor_parallel']}" if (start.get("tensor_parallel") or 1) > 1 else ""),
        ),
        ("versions", ", ".join(f"{k} {versions[k]}" for k in _KEY_VERSIONS if k in versions) or "(unknown)"),
    ]
    if run.output_dir is not None:
        found.append(("output directory", str(run.output_dir)))
    return found


def restart_line(restart: Restart, mttrs: dict[int, float | None] | None = None) -> str:
    """One restart in words; its MTTR as ``runs history`` states it when the run recorded one (recovery.jsonl),
    else the time back past the interrupted step from the metrics alone, named as such."""
    why = "preempted (SIGTERM, checkpoint saved)" if restart.preempted else "interrupted"
    step = restart.interrupted_at_step
    mttr = (mttrs or {}).get(step) if step is not None else None
    back = (
        f"MTTR {mttr_text(mttr)}"
        if mttr is not None
        else f"back past the interrupted step after {_seconds(restart.recovery_s)}"
    )
    return (
        f"attempt {restart.attempt}: {why} after step {step}, resumed from "
        f"{'checkpoint-' + str(restart.resumed_step) if restart.resumed_step is not None else 'scratch'} "
        f"({restart.replayed_steps} step(s) replayed); down {_seconds(restart.downtime_s)}, {back}"
    )


def how_it_went(run: RunLog) -> list[tuple[str, str]]:
    plan_steps = ((run.plan or {}).get("time") or {}).get("total_steps")
    losses = run.values("loss")
    found = [
        (
            "finished",
            f"yes, at step {run.done.get('step')}"
            if run.done
            else f"no: last logged step {run.final_step}" + (f" of {plan_steps}" if plan_steps else ""),
        ),
        ("steps", f"{run.final_step} logged" + (f" of {plan_steps} planned" if plan_steps else "")),
        ("loss", f"{losses[0]:.4f} → {losses[-1]:.4f}" if losses else "none logged"),
        ("attempts", f"{len(run.attempts)} ({len(run.restarts)} restart(s))"),
    ]
    mttrs = recoveries(run)
    found += [("restart", restart_line(r, mttrs)) for r in run.restarts]
    if run.summary and isinstance(run.summary.get("train_runtime"), (int, float)):
        found.append(("train runtime", _seconds(run.summary["train_runtime"]) + " (the last attempt's)"))
    if run.checkpoints:
        seconds = [c["seconds"] for c in run.checkpoints if c["seconds"] == c["seconds"]]
        found.append(
            ("checkpoints", f"{len(run.checkpoints)} saved" + (f", slowest {max(seconds):.2f} s" if seconds else ""))
        )
    if run.preflight:
        ok = run.preflight.get("ok")
        found.append(("preflight", "passed" if ok else f"failed: {run.preflight.get('reason')}"))
    return found + eval_rows(run)  # eval.enabled: the benchmark after training


def cpu_twin(run: RunLog) -> bool:
    """The run trained on CPU (a dry run's twin, or the cpu hardware profile): its plan's figures are the profile's
    nominal ones (a peak of 1 TFLOP/s), which a CPU is expected to miss by orders of magnitude — not a deviation."""
    return (run.start or {}).get("device") == "cpu" or (run.plan or {}).get("hw") == "cpu"


def plan_source(run: RunLog) -> str:
    """What the plan column holds: the plan of the hardware the bundle was planned for, named."""
    hardware = (run.plan or {}).get("hw")
    named = f"the plan for {hardware}" if isinstance(hardware, str) and hardware else "the plan"
    if cpu_twin(run):
        return f"{named} (a CPU twin: the hardware profile's nominal figures, not a prediction for this machine)"
    return named


def summary(run: RunLog, margin: float) -> dict[str, Any]:
    """Everything the report says in words and numbers (the ``--json`` document's body).

    ``deviations`` are the figures beyond the margin that mean something; a CPU twin's (:func:`cpu_twin`) are
    ``expected_deviations`` instead: said, never shown as a failure.
    """
    table: list[Row] = rows(run)
    beyond = deviations(table, margin) if run.plan else []
    mttrs = recoveries(run)
    twin = cpu_twin(run)
    return {
        "label": run.label,
        "what_ran": what_ran(run),
        "how_it_went": how_it_went(run),
        "margin": margin,
        "plan_source": plan_source(run),
        "cpu_twin": twin,
        "plan": [
            {
                "key": r.key,
                "title": r.title,
                "unit": r.unit,
                "predicted": r.predicted,
                "measured": r.measured,
                "ratio": r.ratio,
                "deviates": r.deviates(margin),
                "note": r.note,
            }
            for r in table
        ],
        "deviations": [] if twin else beyond,
        "expected_deviations": beyond if twin else [],
        "restarts": [
            {
                "attempt": r.attempt,
                "interrupted_at_step": r.interrupted_at_step,
                "resumed_step": r.resumed_step,
                "replayed_steps": r.replayed_steps,
                "preempted": r.preempted,
                "downtime_s": r.downtime_s,
                "recovery_s": r.recovery_s,
                "mttr_s": mttrs.get(r.interrupted_at_step) if r.interrupted_at_step is not None else None,
            }
            for r in run.restarts
        ],
        "versions": run.versions,
        "evaluation": eval_json(run),
        "warnings": list(run.warnings) + ([] if run.plan else ["no plan.json: the run is not held against a plan"]),
    }
