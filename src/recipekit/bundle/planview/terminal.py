"""The plan on the terminal: rich renderables for ``recipekit plan`` and ``show`` (the estimate with its memory bar,
the advised layouts, the derived numbers). Rich is imported inside each function: ``build`` never draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from recipekit.bundle.planview.words import (
    describe_layout,
    duration,
    estimate_notes,
    expert_rows,
    nodes_text,
    performance_rows,
    short_layout,
    three_d_rows,
    timing_rows,
    verdict_words,
)
from recipekit.memory import Advice, Estimate

if TYPE_CHECKING:  # rich is imported where terminal views are drawn: `build` writes markdown and JSON only
    from rich.console import RenderableType
    from rich.text import Text

#: Width of the terminal bars, in character cells, for the device's whole memory.
BAR_WIDTH = 40
#: One colour per memory item, in the order memory.estimate lists them; the bar chart and table share them.
ITEM_STYLES = ("blue", "magenta", "red", "green", "yellow", "cyan", "bright_black")


# --------------------------------------------------------------------------------------------------------- terminal
def _bar(gib: float, scale: float, style: str) -> Text:
    from rich.text import Text

    cells = round(gib / scale * BAR_WIDTH) if scale else 0
    return Text("█" * min(cells, BAR_WIDTH), style=style)


def usage_bar(est: Estimate) -> Text:
    """One stacked bar of the device's memory, an item per colour, and a ▏ where the device ends."""
    from rich.text import Text

    scale = max(est.total_gib, est.device_gib)
    bar = Text()
    for item, style in zip(est.memory, ITEM_STYLES):
        bar.append(_bar(item.gib, scale, style))
    device_cell = round(est.device_gib / scale * BAR_WIDTH)
    used = len(bar.plain)
    if used < device_cell:
        bar.append("░" * (device_cell - used), style="dim")
    elif used > device_cell:
        bar = bar[:device_cell] + Text("▏", style="bold") + bar[device_cell:]
    bar.append(f"  {est.total_gib:.1f} / {est.device_gib:g} GiB", style="bold" if est.fits else "bold red")
    return bar


def render_estimate(est: Estimate) -> RenderableType:
    """The memory table with a bar per item, the stacked usage bar, compute/time/cost and the 3D section."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Text.assemble(
        (f"{est.recipe_name}", "bold"),
        f": {est.model_name} on {est.layout.world_size} × {est.hw_name} ({nodes_text(est.layout.nodes)})\n",
        (describe_layout(est), "dim"),
    )
    memory = Table(title="Memory per device", title_justify="left", show_footer=True, expand=False)
    memory.add_column("item", footer="total")
    memory.add_column("GiB", justify="right", footer=f"{est.total_gib:.1f}")
    memory.add_column(f"of {est.device_gib:g} GiB", footer=f"{est.total_gib / est.device_gib:.0%}")
    memory.add_column("counted as", style="dim", overflow="fold")
    scale = max(est.total_gib, est.device_gib)
    for item, style in zip(est.memory, ITEM_STYLES):
        memory.add_row(Text(item.name, style=style), f"{item.gib:.2f}", _bar(item.gib, scale, style), item.basis)
    verdict = Text(verdict_words(est), style="bold green" if est.fits else "bold red")

    timing = _rows_table("Compute, time and cost", timing_rows(est))
    parts: list[RenderableType] = [head, memory, usage_bar(est), verdict, timing]
    three_d = three_d_rows(est)
    if three_d:
        parts.append(_rows_table("Model parallelism", three_d))
    if est.experts is not None:
        parts.append(_rows_table("Mixture of experts", expert_rows(est)))
    parts.append(_rows_table("Performance settings", performance_rows(est)))
    parts += [Text(f"note: {n}", style="dim") for n in estimate_notes(est)]
    return Group(*parts)


def _rows_table(title: str, rows: list[tuple[str, str]]) -> RenderableType:
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("estimate", overflow="fold")
    for name, value in rows:
        table.add_row(name, value)
    return table


#: Columns the advice's override lines are measured against: a line that fits stands beside its number.
OVERRIDE_COLUMNS = 80


def render_advice(advices: Sequence[Advice], *, why: str = "") -> RenderableType:
    """The advised layouts, fastest first: their figures in a table (and why the first is first). The overrides
    to paste are :func:`advice_lines`, printed below it as plain lines."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    if not advices:
        return Text(
            "no layout recipekit tried fits on this cluster: add nodes (cluster.nodes=N) or pick a bigger accelerator",
            style="bold red",
        )
    table = Table(title="Layouts that fit, fastest first", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("step", justify="right")
    table.add_column("MFU", justify="right")
    table.add_column("bubble", justify="right")
    table.add_column("exposed", justify="right")
    table.add_column("GiB/dev", justify="right")
    table.add_column("layout")
    for rank, advice in enumerate(advices, 1):
        est = advice.estimate
        d = est.parallel3d
        table.add_row(
            str(rank),
            duration(est.step_time_s),
            f"{est.compute.mfu:.1%}",
            f"{d.bubble_fraction:.0%}" if d and d.pipeline_parallel > 1 else "-",
            duration(est.exposed_s) if est.exposed_s >= 0.005 else "-",
            f"{est.total_gib:.1f}",
            short_layout(est) + ("" if advice.buildable else " *"),
        )
    parts: list[RenderableType] = [table]
    if not all(a.buildable for a in advices):
        parts.append(Text("* analysis only: the bundle's engine does not build this layout", style="dim"))
    if why:
        parts.append(Text(why))
    parts.append(Text("Overrides of each layout, to add to the recipe's own:", style="bold"))
    return Group(*parts)


def advice_lines(advices: Sequence[Advice]) -> list[str]:
    """One complete line of overrides per layout, to print as it is (never wrapped, never cut): beside its number
    where that fits :data:`OVERRIDE_COLUMNS`, else under it on a line of its own, so that selecting the line copies
    every override whole."""
    lines: list[str] = []
    for rank, advice in enumerate(advices, 1):
        line = " ".join(advice.overrides)
        lines += [f"{rank} {line}"] if len(f"{rank} {line}") <= OVERRIDE_COLUMNS else [f"{rank}:", line]
    return lines


def render_summary(summary: dict[str, Any]) -> RenderableType:
    """``recipekit show``'s derived numbers (:meth:`recipekit.plan.plan.Plan.summary`): a table, then the image tag.

    The tag is printed whole on a line of its own: in the table's value column it would be cut or folded at 80
    columns, and it is what one copies into ``docker pull``. Nested records (the FLOPs) show one field a line.
    """
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title="plan", title_justify="left")
    table.add_column("derived")
    table.add_column("value", overflow="fold")
    for key, value in summary.items():
        if key == "image":
            continue
        text = "\n".join(f"{k}: {v}" for k, v in value.items()) if isinstance(value, dict) else str(value)
        table.add_row(key, text)
    parts: list[RenderableType] = [table]
    if "image" in summary:
        parts.append(Text.assemble(("image ", "bold"), str(summary["image"]), no_wrap=True, overflow="ignore"))
    return Group(*parts)
