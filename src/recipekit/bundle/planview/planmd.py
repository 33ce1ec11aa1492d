"""The estimate as the bundle's plan.md: markdown tables, no colours, stable text."""

from __future__ import annotations

from recipekit.bundle.planview.words import (
    describe_layout,
    estimate_notes,
    expert_rows,
    nodes_text,
    performance_rows,
    three_d_rows,
    timing_rows,
    verdict_words,
)
from recipekit.memory import Estimate


def estimate_markdown(est: Estimate) -> str:
    """The estimate as markdown for the bundle's plan.md (tables, no colours, stable text)."""
    lines = [
        "## Memory, time and cost estimate",
        "",
        f"{est.model_name} on {est.layout.world_size} × {est.hw_name} ({nodes_text(est.layout.nodes)}): "
        f"{describe_layout(est)}.",
        "",
        "| memory per device | GiB | counted as |",
        "|---|---:|---|",
    ]
    lines += [f"| {item.name} | {item.gib:.2f} | {item.basis} |" for item in est.memory]
    lines += [
        f"| **total** | **{est.total_gib:.2f}** | of {est.device_gib:g} GiB per device |",
        "",
        f"**{verdict_words(est)}**",
        "",
        "| compute, time and cost | estimate |",
        "|---|---|",
    ]
    lines += [f"| {name} | {value} |" for name, value in timing_rows(est)]
    three_d = three_d_rows(est)
    if three_d:
        lines += ["", "| model parallelism | estimate |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in three_d]
    if est.experts is not None:
        lines += ["", "| mixture of experts | estimate |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in expert_rows(est)]
    lines += ["", "| performance setting | value (where it lives) |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in performance_rows(est)]
    notes = estimate_notes(est)
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines += [
        "",
        "Estimates from architecture numbers and an assumed utilisation (`hw.assumed_mfu`); see "
        "`recipekit.memory` for the formulas and their sources.",
    ]
    return "\n".join(lines) + "\n"
