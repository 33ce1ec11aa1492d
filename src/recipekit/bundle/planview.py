"""Presentation of the plan and :mod:`recipekit.memory` results: rich renderables for the terminal, markdown for the
bundle's plan.md, and a JSON-able dict for plan.json and ``--json``.

The dict is what other tools read and what goes into bundles, so it has a fixed key order and every float rounded to
a few significant digits: the same recipe gives byte-identical files on any machine. The terminal and markdown views
format the same numbers for reading and never compute anything themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from recipekit.memory import Advice, Estimate
from recipekit.memory.breakdown import SCHEDULE_WORDS
from recipekit.memory.stages import Stage, Stages
from recipekit.plan.layout import Layout

if TYPE_CHECKING:  # rich is imported where terminal views are drawn: `build` writes markdown and JSON only
    from rich.console import RenderableType
    from rich.text import Text

#: Significant digits kept in the JSON dict: far more than the estimates are worth, few enough to be stable.
SIGNIFICANT_DIGITS = 4
#: Width of the terminal bars, in character cells, for the device's whole memory.
BAR_WIDTH = 40
#: One colour per memory item, in the order memory.estimate lists them; the bar chart and table share them.
ITEM_STYLES = ("blue", "magenta", "red", "green", "yellow", "cyan", "bright_black")


# ------------------------------------------------------------------------------------------------------- formatting
def _round(value: float) -> float:
    """``value`` to SIGNIFICANT_DIGITS significant digits (via its decimal text, so the result is reproducible)."""
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def _opt(value: float | None) -> float | None:
    return None if value is None else _round(value)


def duration(seconds: float | None) -> str:
    """A duration for reading: seconds below a minute, then minutes, hours, days."""
    if seconds is None:
        return "n/a"
    if seconds < 60:
        return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _count(value: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.3g}"


def _gb(value: float) -> str:
    return f"{value:,.0f} GB" if value >= 100 else f"{value:.3g} GB"


def _nodes(count: int) -> str:
    return f"{count} node" + ("" if count == 1 else "s")


def _cost(est: Estimate) -> str:
    if est.cost is None:
        return "n/a (set hw.price_per_device_hour)" if est.device_hours is not None else "n/a"
    return f"{est.cost:,.0f} ({est.price_per_device_hour:g} per device-hour)"


def describe_layout(est: Estimate) -> str:
    """The layout in one line: parallel option and offloads, checkpointing, TP × PP, and the batch arithmetic."""
    par, lay = est.parallel, est.layout
    offload = [
        f"{what} → {where}"
        for what, where in (("optimizer", par.offload_optimizer), ("params", par.offload_param))
        if where != "none"
    ]
    parts = [
        par.name + (f" ({', '.join(offload)})" if offload else ""),
        f"checkpointing {'on' if par.gradient_checkpointing else 'off'}",
    ]
    if lay.model_parallel > 1 or lay.expert_parallel > 1:
        parts.append(layout_words(lay))
    parts.append(
        f"micro {lay.micro_batch_size} × accum {lay.gradient_accumulation_steps} × dp {lay.dp_size}"
        f" = {lay.global_batch_size} × {est.seq_len} tokens"
    )
    return ", ".join(parts)


def layout_words(lay: Layout) -> str:
    """The model-parallel dimensions in a few words: TP (with SP) × CP × PP (with virtual stages) and EP."""
    dims = [f"TP {lay.tensor_parallel}" + (" SP" if lay.sequence_parallel else "")]
    dims += [f"CP {lay.context_parallel}"] if lay.context_parallel > 1 else []
    if lay.pipeline_parallel > 1:
        dims += [f"PP {lay.pipeline_parallel}" + (f" VP {lay.virtual_stages}" if lay.virtual_stages > 1 else "")]
    words = " × ".join(dims)
    return words + (f", EP {lay.expert_parallel}" if lay.expert_parallel > 1 else "")


def _verdict(est: Estimate) -> str:
    if est.fits:
        return f"fits: {est.total_gib:.1f} of {est.device_gib:g} GiB, {est.headroom_gib:.1f} GiB headroom"
    if not est.fits_device:
        return f"DOES NOT FIT: {est.total_gib:.1f} GiB needed, {est.device_gib:g} GiB per device"
    return (
        f"DOES NOT FIT: {est.offload.host_gib_per_node:.0f} GiB host memory per node for offload, the pod asks "
        f"for {est.offload.host_limit_gib:g} GiB"
    )


def _experts_words(c: Any) -> str:
    return ", top-k experts" if c.params_active != c.params_total else ""


def _mfu_words(est: Estimate) -> str:
    c = est.compute
    stated = f"hw.assumed_mfu {c.assumed_mfu:g}" + (" in the causal count" if c.mfu_attention == "causal" else "")
    reached = "" if c.attainable else ", NOT reachable on this layout"
    return (
        f"{c.mfu:.1%} of {c.peak_tflops:g} TFLOP/s over the whole step ({stated}{reached}); "
        f"HFU {c.hfu:.1%}; compute runs at {c.efficiency:.0%}"
    )


def _step_words(est: Estimate) -> str:
    """Where the step goes, item by item."""
    return ", ".join(f"{item.name} {duration(item.seconds)}" for item in est.time)


#: Where the MFU's FLOPs are defined (the counter's convention, LoRA's frozen base, what metrics.jsonl divides by).
MFU_BASIS = "see docs/models.md#flops-one-definition"


def _timing_rows(est: Estimate) -> list[tuple[str, str]]:
    c, comm, off = est.compute, est.communication, est.offload
    rows = [
        ("parameters", _params_words(est)),
        # the basis is explained once, in the docs; every plan points there (issue 41)
        ("MFU basis", f"model.flops{' (top-k experts)' if _experts_words(c) else ''}; {MFU_BASIS}"),
        (
            "FLOPs per token",
            f"{c.flops_per_token / 1e9:,.1f} GFLOP"
            + (f" (× {c.recompute_factor:.2f} recomputation)" if c.recompute_factor != 1 else ""),
        ),
        ("tokens per step", f"{c.tokens_per_step:,}"),
        ("MFU", _mfu_words(est)),
        ("step time", f"{duration(est.step_time_s)}: {_step_words(est)}"),
        (
            "DP communication",
            f"{comm.pattern}: {_gb(comm.volume_gb)} per device over {comm.link} "
            f"({'inter' if comm.crosses_nodes else 'intra'}-node, {comm.bandwidth_gbps:g} GB/s): "
            f"{duration(comm.time_s)}, {duration(comm.exposed_s)} exposed",
        ),
    ]
    if off.time_s or off.host_gib_per_node or off.nvme_gib_per_node:
        rows.append(
            (
                "offload",
                f"{off.host_gib_per_node:.0f} GiB host per node (pod: {off.host_limit_gib:g} GiB), "
                f"{off.nvme_gib_per_node:.0f} GiB NVMe per node, {duration(off.time_s)} per step",
            )
        )
    rows += [
        ("data per epoch", _data_words(est)),
        (
            "total",
            f"{est.total_steps:,} steps: {duration(est.total_time_s)}"
            if est.total_steps
            else "n/a (no data.num_samples or train.max_steps)",
        ),
        ("device-hours", f"{est.device_hours:,.0f}" if est.device_hours is not None else "n/a"),
        ("cost", _cost(est)),
    ]
    return rows


def _params_words(est: Estimate) -> str:
    c = est.compute
    active = f", {_count(c.params_active)} active per token" if c.params_active != c.params_total else ""
    return f"{_count(c.params_total)} total{active}, {_count(c.params_trainable)} trainable"


def _expert_rows(est: Estimate) -> list[tuple[str, str]]:
    e = est.experts
    if e is None:
        return []
    rows = [
        (
            "experts",
            f"{e.num_experts} per MoE layer, top-{e.experts_per_token} per token: {_count(e.expert_params)} of the "
            f"{_count(e.params_total)} parameters; {_count(e.params_active)} active (memory counts all, FLOPs the "
            "active)",
        ),
    ]
    if e.expert_parallel > 1:
        rows += [
            (
                f"EP {e.expert_parallel} would save",
                f"{e.saved_gib:.2f} GiB per device (the experts' states {e.expert_gib:.2f} → "
                f"{e.expert_gib_with_ep:.2f} GiB) and {_gb(e.dp_gb - e.dp_gb_with_ep)} of data-parallel traffic "
                f"per device per step (the experts' {_gb(e.dp_gb)} → {_gb(e.dp_gb_with_ep)})",
            ),
            (
                f"EP {e.expert_parallel} would cost",
                f"{_gb(e.alltoall_gb)} of token all-to-all per device per step over {e.link}: "
                f"{duration(e.alltoall_time_s)}",
            ),
        ]
    rows.append(("backend", e.note))
    return rows


def _data_words(est: Estimate) -> str:
    """Rows and tokens of one epoch and where each number comes from (``plan.data``: exact once prepared)."""
    data = est.plan.data
    if not data.rows:
        return "n/a (no data.num_rows, data.num_tokens or data.num_samples)"
    exact = "exact, prepared" if data.exact else "estimated"
    return f"{data.rows:,} rows ({data.rows_from}), {data.tokens:,} tokens ({data.tokens_from}); {exact}"


def _three_d_rows(est: Estimate) -> list[tuple[str, str]]:
    d = est.parallel3d
    if d is None:
        return []
    schedule = SCHEDULE_WORDS[d.schedule]
    rows = [("layout", f"{layout_words(est.layout)}; {d.groups}")]
    if d.pipeline_parallel > 1:
        layers = "/".join(str(n) for n in _runs(d.stage_layers))
        rows.append(
            (
                "pipeline",
                f"{schedule}, {d.micro_batches} micro-batches per step, layers per stage {layers}"
                + (f", {d.virtual_stages} virtual stages" if d.virtual_stages > 1 else ""),
            )
        )
        formula = {
            "1f1b": "(p − 1)/(m + p − 1)",
            "interleaved_1f1b": "(p − 1)/(v·m + p − 1)",
            "dualpipe": "(p − 2)/(3m + p − 2)",
        }[d.schedule]
        rows.append(("pipeline bubble", f"{d.bubble_fraction:.1%} = {formula}"))
    if d.tensor_parallel > 1:
        rows += [
            (
                "TP traffic",
                f"{d.tp_allreduces_per_layer} all-reduces per layer"
                + (" (as all-gather + reduce-scatter: SP)" if d.sequence_parallel else "")
                + f", {_gb(d.tp_allreduce_gb_per_layer)} per layer per micro-batch + {_gb(d.tp_head_gb)} "
                f"embedding/head, {_gb(d.tp_volume_gb)} per step over {d.tp_link}: {duration(d.tp_time_s)}, "
                "none hidden",
            ),
            ("TP inside a node", "yes" if d.tp_inside_node else "NO: every layer's all-reduce crosses the network"),
        ]
    if d.context_parallel > 1:
        rows.append(
            (
                "CP traffic",
                f"keys and values around a ring of {d.context_parallel}: {_gb(d.cp_volume_gb)} per step, "
                f"{duration(d.cp_time_s)}, {duration(d.cp_exposed_s)} not hidden by attention",
            )
        )
    rows.append(("backend", d.note))
    return rows


def _runs(values: tuple[int, ...]) -> list[str]:
    """Stage layer counts with repeats folded: 7/8×14/7."""
    out: list[str] = []
    for value in values:
        if out and out[-1].split("×")[0] == str(value):
            count = int(out[-1].split("×")[1]) if "×" in out[-1] else 1
            out[-1] = f"{value}×{count + 1}"
        else:
            out.append(str(value))
    return out


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
        f": {est.model_name} on {est.layout.world_size} × {est.hw_name} ({_nodes(est.layout.nodes)})\n",
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
    verdict = Text(_verdict(est), style="bold green" if est.fits else "bold red")

    timing = _rows_table("Compute, time and cost", _timing_rows(est))
    parts: list[RenderableType] = [head, memory, usage_bar(est), verdict, timing]
    three_d = _three_d_rows(est)
    if three_d:
        parts.append(_rows_table("Model parallelism", three_d))
    if est.experts is not None:
        parts.append(_rows_table("Mixture of experts", _expert_rows(est)))
    parts.append(_rows_table("Performance settings", _performance_rows(est)))
    parts += [Text(f"note: {n}", style="dim") for n in _notes(est)]
    return Group(*parts)


def _rows_table(title: str, rows: list[tuple[str, str]]) -> RenderableType:
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("estimate", overflow="fold")
    for name, value in rows:
        table.add_row(name, value)
    return table


def _performance_rows(est: Estimate) -> list[tuple[str, str]]:
    """plan/performance.py's settings: the value, then where it lives and who applies it."""
    from recipekit.plan.performance import performance_settings

    return [(s.name, f"{s.value} ({s.where})") for s in performance_settings(est.recipe, est.plan)]


def _notes(est: Estimate) -> list[str]:
    """The estimate's notes, less the 3D note its own section already shows."""
    return [n for n in est.notes if est.parallel3d is None or n != est.parallel3d.note]


#: Columns the advice's override lines are measured against: a line that fits stands beside its number.
OVERRIDE_COLUMNS = 80


def _short_layout(est: Estimate) -> str:
    """The layout in a table cell: its model-parallel dimensions, else its parallel option."""
    lay = est.layout
    if lay.model_parallel > 1 or lay.expert_parallel > 1:
        return layout_words(lay).replace(" × ", "×").replace("TP ", "TP").replace("PP ", "PP").replace("CP ", "CP")
    return est.parallel.name


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
            _short_layout(est) + ("" if advice.buildable else " *"),
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


# --------------------------------------------------------------------------------------------------------- markdown
def estimate_markdown(est: Estimate) -> str:
    """The estimate as markdown for the bundle's plan.md (tables, no colours, stable text)."""
    lines = [
        "## Memory, time and cost estimate",
        "",
        f"{est.model_name} on {est.layout.world_size} × {est.hw_name} ({_nodes(est.layout.nodes)}): "
        f"{describe_layout(est)}.",
        "",
        "| memory per device | GiB | counted as |",
        "|---|---:|---|",
    ]
    lines += [f"| {item.name} | {item.gib:.2f} | {item.basis} |" for item in est.memory]
    lines += [
        f"| **total** | **{est.total_gib:.2f}** | of {est.device_gib:g} GiB per device |",
        "",
        f"**{_verdict(est)}**",
        "",
        "| compute, time and cost | estimate |",
        "|---|---|",
    ]
    lines += [f"| {name} | {value} |" for name, value in _timing_rows(est)]
    three_d = _three_d_rows(est)
    if three_d:
        lines += ["", "| model parallelism | estimate |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in three_d]
    if est.experts is not None:
        lines += ["", "| mixture of experts | estimate |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in _expert_rows(est)]
    lines += ["", "| performance setting | value (where it lives) |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in _performance_rows(est)]
    notes = _notes(est)
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines += [
        "",
        "Estimates from architecture numbers and an assumed utilisation (`hw.assumed_mfu`); see "
        "`recipekit.memory` for the formulas and their sources.",
    ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------------------- JSON
def _experts_dict(est: Estimate) -> dict[str, Any]:
    e = est.experts
    assert e is not None
    return {
        "num_experts": e.num_experts,
        "experts_per_token": e.experts_per_token,
        "params_total": e.params_total,
        "params_active": e.params_active,
        "expert_params": e.expert_params,
        "expert_parallel": e.expert_parallel,
        "expert_gib": _round(e.expert_gib),
        "expert_gib_with_ep": _round(e.expert_gib_with_ep),
        "dp_gb_per_step": _round(e.dp_gb),
        "dp_gb_per_step_with_ep": _round(e.dp_gb_with_ep),
        "alltoall_gb_per_step": _round(e.alltoall_gb),
        "alltoall_time_s": _round(e.alltoall_time_s),
        "link": e.link,
        "buildable": e.buildable,
        "note": e.note,
    }


def estimate_dict(est: Estimate) -> dict[str, Any]:
    """The estimate as plain JSON types, keys in a fixed order, floats rounded (byte-identical bundles)."""
    c, comm, off, d = est.compute, est.communication, est.offload, est.parallel3d
    return {
        "recipe": est.recipe_name,
        "model": est.model_name,
        "hw": est.hw_name,
        "layout": layout_dict(est),
        "memory_gib": {
            "items": [{"name": item.name, "gib": _round(item.gib), "basis": item.basis} for item in est.memory],
            "total": _round(est.total_gib),
            "device": _round(est.device_gib),
            "headroom": _round(est.headroom_gib),
            "fits_device": est.fits_device,
            "fits": est.fits,
            "largest_item": est.largest_item.name,
        },
        "offload": {
            "host_gib_per_node": _round(off.host_gib_per_node),
            "host_limit_gib": _round(off.host_limit_gib),
            "host_fits": off.host_fits,
            "nvme_gib_per_node": _round(off.nvme_gib_per_node),
            "time_s_per_step": _round(off.time_s),
        },
        "compute": {
            "params_total": c.params_total,
            "params_active": c.params_active,
            "params_trainable": c.params_trainable,
            "flops_per_token": _round(c.flops_per_token),
            "tokens_per_step": c.tokens_per_step,
            "recompute_factor": _round(c.recompute_factor),
            "peak_tflops": _round(c.peak_tflops),
            "assumed_mfu": _round(c.assumed_mfu),
            "assumed_mfu_attention": c.mfu_attention,
            "mfu": _round(c.mfu),
            "hfu": _round(c.hfu),
            "efficiency": _round(c.efficiency),
            "attainable": c.attainable,
            "time_s_per_step": _round(c.time_s),
        },
        "communication": {
            "pattern": comm.pattern,
            "volume_gb_per_step": _round(comm.volume_gb),
            "link": comm.link,
            "crosses_nodes": comm.crosses_nodes,
            "bandwidth_gbps": _round(comm.bandwidth_gbps),
            "time_s": _round(comm.time_s),
            "exposed_s": _round(comm.exposed_s),
        },
        "parallel3d": None
        if d is None
        else {
            "tensor_parallel": d.tensor_parallel,
            "pipeline_parallel": d.pipeline_parallel,
            "micro_batches": d.micro_batches,
            "bubble_fraction": _round(d.bubble_fraction),
            "tp_allreduces_per_layer": d.tp_allreduces_per_layer,
            "tp_allreduce_gb_per_layer": _round(d.tp_allreduce_gb_per_layer),
            "tp_head_gb": _round(d.tp_head_gb),
            "tp_volume_gb_per_step": _round(d.tp_volume_gb),
            "tp_inside_node": d.tp_inside_node,
            "tp_link": d.tp_link,
            "tp_time_s": _round(d.tp_time_s),
            "context_parallel": d.context_parallel,
            "virtual_stages": d.virtual_stages,
            "schedule": d.schedule,
            "sequence_parallel": d.sequence_parallel,
            "stage_layers": list(d.stage_layers),
            "cp_volume_gb_per_step": _round(d.cp_volume_gb),
            "cp_time_s": _round(d.cp_time_s),
            "cp_exposed_s": _round(d.cp_exposed_s),
            "groups": d.groups,
            "buildable": d.buildable,
            "note": d.note,
        },
        "experts": None if est.experts is None else _experts_dict(est),
        "data": est.plan.data.summary(),
        "time": {
            "step_s": _round(est.step_time_s),
            "breakdown": [{"name": t.name, "seconds": _round(t.seconds), "basis": t.basis} for t in est.time],
            "total_steps": est.total_steps,
            "total_s": _opt(est.total_time_s),
            "device_hours": _opt(est.device_hours),
            "price_per_device_hour": _opt(est.price_per_device_hour),
            "cost": _opt(est.cost),
        },
        "notes": list(est.notes),
    }


def layout_dict(est: Estimate) -> dict[str, Any]:
    """What the estimate is for, all exact (integers, names, flags): the parallel choice, the plan's layout numbers
    (given and derived, as the plan names them), the sequence length and the precision."""
    par = est.parallel
    return {
        "parallel": par.name,
        "zero_stage": par.zero_stage,
        "offload_optimizer": par.offload_optimizer,
        "offload_param": par.offload_param,
        "gradient_checkpointing": par.gradient_checkpointing,
        "recompute_granularity": par.recompute_granularity,
        "distributed_optimizer": par.distributed_optimizer,
        "sequence_parallel": est.layout.sequence_parallel,
        "pipeline_schedule": est.layout.schedule,
        **est.layout.numbers(),
        "seq_len": est.seq_len,
        "precision": est.precision,
    }


def advice_dict(advices: Sequence[Advice]) -> list[dict[str, Any]]:
    """Advice for ``--json``: each layout's overrides and its estimate dict, fastest first."""
    return [
        {"overrides": list(a.overrides), "buildable": a.buildable, "estimate": estimate_dict(a.estimate)}
        for a in advices
    ]


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
            _short_layout(est),
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
            "time_s": _opt(run.total_time_s),
            "device_hours": _opt(run.device_hours),
            "cost": _opt(run.cost),
            "fits": run.fits,
        },
    }
