"""The words and rows the plan's views share: durations, counts, the layout in words, the verdict, and the
timing, expert and 3D rows, each computed once from the estimate and shown alike on the terminal, in plan.md and
(rounded the same way) in plan.json.
"""

from __future__ import annotations

from typing import Any

from recipekit.memory import Estimate
from recipekit.memory.breakdown import SCHEDULE_WORDS
from recipekit.plan.layout import Layout

#: Significant digits kept in the JSON dict: far more than the estimates are worth, few enough to be stable.
SIGNIFICANT_DIGITS = 4


# ------------------------------------------------------------------------------------------------------- formatting
def rounded(value: float) -> float:
    """``value`` to SIGNIFICANT_DIGITS significant digits (via its decimal text, so the result is reproducible)."""
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def rounded_opt(value: float | None) -> float | None:
    return None if value is None else rounded(value)


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


def nodes_text(count: int) -> str:
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


def verdict_words(est: Estimate) -> str:
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


def timing_rows(est: Estimate) -> list[tuple[str, str]]:
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


def performance_rows(est: Estimate) -> list[tuple[str, str]]:
    """plan/performance.py's settings: the value, then where it lives and who applies it."""
    from recipekit.plan.performance import performance_settings

    return [(s.name, f"{s.value} ({s.where})") for s in performance_settings(est.recipe, est.plan)]


def expert_rows(est: Estimate) -> list[tuple[str, str]]:
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


def three_d_rows(est: Estimate) -> list[tuple[str, str]]:
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


def estimate_notes(est: Estimate) -> list[str]:
    """The estimate's notes, less the 3D note its own section already shows."""
    return [n for n in est.notes if est.parallel3d is None or n != est.parallel3d.note]


def short_layout(est: Estimate) -> str:
    """The layout in a table cell: its model-parallel dimensions, else its parallel option."""
    lay = est.layout
    if lay.model_parallel > 1 or lay.expert_parallel > 1:
        return layout_words(lay).replace(" × ", "×").replace("TP ", "TP").replace("PP ", "PP").replace("CP ", "CP")
    return est.parallel.name
