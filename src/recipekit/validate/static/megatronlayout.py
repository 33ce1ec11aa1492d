"""The Megatron engine's rules, checked on a built bundle before any pod is scheduled: recipe.yaml's ``megatron``
document read by the room's own reader and laid against the plan and the model.

The reader is :mod:`recipekit.runtime.boundary.megatronview` (every field typed, SP needing TP); the rules are the
ones Megatron-core's argument validation applies at start-up (``megatron/training/arguments.py`` ``validate_args``
and ``ModelParallelConfig.__post_init__`` in 0.16.1):

* the world the Job starts (plan.world_size) holds TP × PP × CP, the global batch is micro × data-parallel ×
  accumulation, EP × expert-TP × PP divides the world (the room's own ``check_world``);
* the document's sizes are the plan's; TP stays inside a pod (its all-reduces run every layer);
* TP divides the attention and key/value heads, PP × virtual stages the layers, EP the experts.

A bundle of another engine passes it (skipped: its own checks are consistency.tensor-parallel and the batch checks).
"""

from __future__ import annotations

from recipekit.bundle.files import RECIPE
from recipekit.runtime.boundary.megatronview import MegatronDocError, check_world, read_megatron
from recipekit.validate.shared.loader import Bundle
from recipekit.validate.shared.results import Result


def check_megatron_layout(bundle: Bundle) -> Result:
    result = Result(
        "consistency.megatron",
        "the megatron document: the room's reader, the world it needs, heads / layers / experts per rank",
    )
    doc, plan = bundle.doc or {}, bundle.plan
    if "megatron" not in doc:
        return result.skip("not a bundle of the Megatron engine")
    try:
        megatron = read_megatron(doc["megatron"])
    except MegatronDocError as exc:
        for problem in exc.problems:
            result.fail(RECIPE, "megatron", problem)
        return result
    world = plan.get("world_size")
    if not isinstance(world, int):
        return result.skip("needs recipe.yaml's plan.world_size")
    for problem in check_world(megatron, world):
        result.fail(RECIPE, "megatron", problem)
    model = megatron.sections["model"]
    tp, pp = int(model["tensor_model_parallel_size"]), int(model["pipeline_model_parallel_size"])
    vpp, ep = int(model.get("virtual_pipeline_model_parallel_size") or 1), int(model["expert_model_parallel_size"])
    for key, size in (("tensor_parallel", tp), ("pipeline_parallel", pp), ("expert_parallel", ep)):
        if plan.get(key, 1) != size:
            result.fail(RECIPE, f"megatron.model.{key}", f"{size}, but plan.{key} = {plan.get(key, 1)}")
    per_pod = plan.get("devices_per_pod")
    if tp > 1 and isinstance(per_pod, int) and per_pod % tp:
        result.fail(
            RECIPE,
            "megatron.model.tensor_model_parallel_size",
            f"TP {tp} does not divide the {per_pod} devices of a pod: a TP group would all-reduce over the network "
            "in every layer",
        )
    if bundle.recipe is not None:
        spec = bundle.recipe.model
        if spec.num_attention_heads % tp or spec.num_kv_heads % tp:
            result.fail(
                RECIPE,
                "megatron.model.tensor_model_parallel_size",
                f"TP {tp} does not divide {spec.name}'s {spec.num_attention_heads} attention and {spec.num_kv_heads} "
                "key/value heads",
            )
        if spec.num_layers % (pp * vpp):
            result.fail(
                RECIPE,
                "megatron.model.pipeline_model_parallel_size",
                f"PP {pp} × {vpp} virtual stage(s) does not divide {spec.name}'s {spec.num_layers} layers",
            )
        if ep > 1 and (not spec.num_experts or spec.num_experts % ep):
            result.fail(
                RECIPE,
                "megatron.model.expert_model_parallel_size",
                f"EP {ep} does not divide {spec.name}'s {spec.num_experts} experts",
            )
    if not result.failed:
        result.reason = f"TP {tp} × PP {pp} (× {vpp} virtual) × EP {ep} on {world} ranks: the room's reader and rules"
    return result
