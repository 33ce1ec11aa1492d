"""The estimate as the bundle's plan.json and ``--json``: plain JSON types in a fixed key order, floats rounded to a
few significant digits, so the same recipe gives byte-identical files on any machine (what other tools read).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from recipekit.bundle.planview.words import rounded, rounded_opt
from recipekit.memory import Advice, Estimate


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
        "expert_gib": rounded(e.expert_gib),
        "expert_gib_with_ep": rounded(e.expert_gib_with_ep),
        "dp_gb_per_step": rounded(e.dp_gb),
        "dp_gb_per_step_with_ep": rounded(e.dp_gb_with_ep),
        "alltoall_gb_per_step": rounded(e.alltoall_gb),
        "alltoall_time_s": rounded(e.alltoall_time_s),
        "link": e.link,
        "buildable": e.buildable,
        "note": e.note,
    }


def _memory_dict(est: Estimate) -> dict[str, Any]:
    return {
        "items": [{"name": item.name, "gib": rounded(item.gib), "basis": item.basis} for item in est.memory],
        "total": rounded(est.total_gib),
        "device": rounded(est.device_gib),
        "headroom": rounded(est.headroom_gib),
        "fits_device": est.fits_device,
        "fits": est.fits,
        "largest_item": est.largest_item.name,
    }


def _offload_dict(est: Estimate) -> dict[str, Any]:
    off = est.offload
    return {
        "host_gib_per_node": rounded(off.host_gib_per_node),
        "host_limit_gib": rounded(off.host_limit_gib),
        "host_fits": off.host_fits,
        "nvme_gib_per_node": rounded(off.nvme_gib_per_node),
        "time_s_per_step": rounded(off.time_s),
    }


def _compute_dict(est: Estimate) -> dict[str, Any]:
    c = est.compute
    return {
        "params_total": c.params_total,
        "params_active": c.params_active,
        "params_trainable": c.params_trainable,
        "flops_per_token": rounded(c.flops_per_token),
        "tokens_per_step": c.tokens_per_step,
        "recompute_factor": rounded(c.recompute_factor),
        "peak_tflops": rounded(c.peak_tflops),
        "assumed_mfu": rounded(c.assumed_mfu),
        "assumed_mfu_attention": c.mfu_attention,
        "mfu": rounded(c.mfu),
        "hfu": rounded(c.hfu),
        "efficiency": rounded(c.efficiency),
        "attainable": c.attainable,
        "time_s_per_step": rounded(c.time_s),
    }


def _communication_dict(est: Estimate) -> dict[str, Any]:
    comm = est.communication
    return {
        "pattern": comm.pattern,
        "volume_gb_per_step": rounded(comm.volume_gb),
        "link": comm.link,
        "crosses_nodes": comm.crosses_nodes,
        "bandwidth_gbps": rounded(comm.bandwidth_gbps),
        "time_s": rounded(comm.time_s),
        "exposed_s": rounded(comm.exposed_s),
    }


def _parallel3d_dict(est: Estimate) -> dict[str, Any]:
    d = est.parallel3d
    assert d is not None
    return {
        "tensor_parallel": d.tensor_parallel,
        "pipeline_parallel": d.pipeline_parallel,
        "micro_batches": d.micro_batches,
        "bubble_fraction": rounded(d.bubble_fraction),
        "tp_allreduces_per_layer": d.tp_allreduces_per_layer,
        "tp_allreduce_gb_per_layer": rounded(d.tp_allreduce_gb_per_layer),
        "tp_head_gb": rounded(d.tp_head_gb),
        "tp_volume_gb_per_step": rounded(d.tp_volume_gb),
        "tp_inside_node": d.tp_inside_node,
        "tp_link": d.tp_link,
        "tp_time_s": rounded(d.tp_time_s),
        "context_parallel": d.context_parallel,
        "virtual_stages": d.virtual_stages,
        "schedule": d.schedule,
        "sequence_parallel": d.sequence_parallel,
        "stage_layers": list(d.stage_layers),
        "cp_volume_gb_per_step": rounded(d.cp_volume_gb),
        "cp_time_s": rounded(d.cp_time_s),
        "cp_exposed_s": rounded(d.cp_exposed_s),
        "groups": d.groups,
        "buildable": d.buildable,
        "note": d.note,
    }


def estimate_dict(est: Estimate) -> dict[str, Any]:
    """The estimate as plain JSON types, keys in a fixed order, floats rounded (byte-identical bundles)."""
    return {
        "recipe": est.recipe_name,
        "model": est.model_name,
        "hw": est.hw_name,
        "layout": layout_dict(est),
        "memory_gib": _memory_dict(est),
        "offload": _offload_dict(est),
        "compute": _compute_dict(est),
        "communication": _communication_dict(est),
        "parallel3d": None if est.parallel3d is None else _parallel3d_dict(est),
        "experts": None if est.experts is None else _experts_dict(est),
        "data": est.plan.data.summary(),
        "time": {
            "step_s": rounded(est.step_time_s),
            "breakdown": [{"name": t.name, "seconds": rounded(t.seconds), "basis": t.basis} for t in est.time],
            "total_steps": est.total_steps,
            "total_s": rounded_opt(est.total_time_s),
            "device_hours": rounded_opt(est.device_hours),
            "price_per_device_hour": rounded_opt(est.price_per_device_hour),
            "cost": rounded_opt(est.cost),
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
