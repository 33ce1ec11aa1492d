"""A run of several stages on the terminal and in ``--json``: each stage's heading, the stages side by side, and
their sums (``recipekit plan --stage``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recipekit.bundle.planview.planjson import estimate_dict
from recipekit.bundle.planview.words import duration, rounded_opt, short_layout
from recipekit.memory.stages import Stage, Stages

if TYPE_CHECKING:  # rich is imported where terminal views are drawn: `build` writes markdown and JSON only
    from rich.console import RenderableType


# ------------------------------------------------------------------------------------------------------- stages
def stage_heading(number: int, stage: Stage) -> RenderableType:
    """The line above a stage's estimate: its number and the overrides that make it."""
    from rich.text import Text

    made = " ".join(stage.overrides) if stage.overrides else "the base recipe"
    return Text.assemble((f"Stage {number}: ", "bold"), made)


def render_stages(run: Stages) -> RenderableType:
    """The stages side by side (sequence, layout, step, steps, time, device-hours), then their sums."""
    from rich.table import Table

    table = Table(title="Stages of the run", title_justify="left", show_footer=True)
    table.add_column("#", justify="right", footer="all")
    table.add_column("seq", justify="right")
    table.add_column("layout")
    table.add_column("step", justify="right")
    table.add_column("steps", justify="right")
    table.add_column("time", justify="right", footer=duration(run.total_time_s))
    total_hours = f"{run.device_hours:,.0f}" if run.device_hours is not None else "n/a"
    table.add_column("device-h", justify="right", footer=total_hours)
    for number, stage in enumerate(run.stages, 1):
        est = stage.estimate
        table.add_row(
            str(number),
            str(est.seq_len),
            short_layout(est),
            duration(est.step_time_s),
            f"{est.total_steps:,}" if est.total_steps else "n/a",
            duration(est.total_time_s),
            f"{est.device_hours:,.0f}" if est.device_hours is not None else "n/a",
        )
    if run.cost is not None:
        table.caption = f"cost {run.cost:,.0f}"
    return table


def stages_dict(run: Stages) -> dict[str, Any]:
    """``plan --stage --json``: each stage's overrides and estimate, and the sums."""
    return {
        "stages": [{"overrides": list(s.overrides), "estimate": estimate_dict(s.estimate)} for s in run.stages],
        "total": {
            "time_s": rounded_opt(run.total_time_s),
            "device_hours": rounded_opt(run.device_hours),
            "cost": rounded_opt(run.cost),
            "fits": run.fits,
        },
    }
