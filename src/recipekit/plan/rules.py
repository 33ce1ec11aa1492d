"""The plan's rules across recipe sections, one function each: every problem of a layout, of ZeRO and offload, of the
data against the model and the mode, of streaming and the pod's volumes, with its arithmetic (the layout's own
Megatron-core rules, stages, heads and experts, are :mod:`recipekit.plan.layoutrules`).

:func:`recipekit.plan.plan.make_plan` runs them all before giving up, so a recipe's problems are reported at once.
"""

from __future__ import annotations

from recipekit.base.errors import Problem
from recipekit.plan.layout import Layout
from recipekit.recipe.sections import ModelSpec, Recipe
from recipekit.recipe.volumes import off_volumes
from recipekit.runtime.boundary import recipeview


def layout_problems(recipe: Recipe, layout: Layout) -> list[Problem]:
    """Devices a node does not have (what the engine cannot run of a layout is the engine's: plan/engines)."""
    hw, problems = recipe.hw, []
    if layout.devices_per_pod > hw.devices_per_node:
        problems.append(
            Problem(
                "cluster.devices_per_pod",
                f"{layout.devices_per_pod} devices per pod, but a {hw.name} node has {hw.devices_per_node}",
                hint=f"at most {hw.devices_per_node}; add nodes instead",
            )
        )
    return problems


def zero_problems(recipe: Recipe) -> list[Problem]:
    """Offload needs ZeRO (parameters need stage 3, NVMe a path); QLoRA's 4-bit base cannot be ZeRO-3 partitioned."""
    par, problems = recipe.parallel, []
    zero = par.zero_stage
    if zero == 0 and (par.offload_optimizer != "none" or par.offload_param != "none"):
        problems.append(
            Problem(
                "parallel.offload_optimizer", "offload needs DeepSpeed ZeRO (zero_stage ≥ 1)", hint="zero_stage: 2 or 3"
            )
        )
    if par.offload_param != "none" and zero != 3:
        problems.append(Problem("parallel.offload_param", f"parameter offload needs zero_stage 3 (got {zero})"))
    if "nvme" in (par.offload_optimizer, par.offload_param) and not par.nvme_path:
        problems.append(
            Problem(
                "parallel.nvme_path", "nvme offload without a path", hint="a local NVMe directory, e.g. /local_nvme"
            )
        )
    if recipe.mode.kind == "qlora" and zero == 3:
        problems.append(
            Problem(
                "parallel.zero_stage",
                "qlora with ZeRO-3 is not supported by this backend",
                hint="use parallel=ddp, zero1 or zero2 (the 4-bit base is small)",
            )
        )
    return problems


def data_problems(recipe: Recipe) -> list[Problem]:
    """The data's format against the mode (pretraining reads raw text, the others instructions), and its sequence
    length against the model's."""
    mode, data, model, problems = recipe.mode, recipe.data, recipe.model, []
    if mode.kind == "pretrain" and data.format != "text":
        problems.append(Problem("data.format", f"pretrain trains on raw text, got {data.format!r}", hint="data=text"))
    if mode.kind != "pretrain" and data.format == "text":
        problems.append(
            Problem("data.format", f"{mode.kind} needs instruction data, got raw text", hint="data=alpaca or data=chat")
        )
    context, scaling = context_length(model)
    if data.max_len > context:
        basis = (
            f"its context with {scaling} ({context})"
            if scaling
            else f"its max_position_embeddings ({context}), and its config has no rope scaling"
        )
        problems.append(
            Problem(
                "data.max_len",
                f"{data.max_len} exceeds {model.name}'s context: {basis}",
                hint=f"at most {context}"
                + ("" if scaling else ", or a model option imported from a config.json that scales RoPE (YaRN)"),
            )
        )
    return problems


def context_length(model: ModelSpec) -> tuple[int, str]:
    """The longest sequence ``model`` takes, and the RoPE scaling that gives it ('' for none): its
    max_position_embeddings, or where its config scales RoPE (transformers' ``rope_scaling``, or ``rope_parameters``
    since transformers 5, of a type other than ``default``) the scaling factor × the length it was trained at
    (``original_max_position_embeddings``), if longer. Beyond it the positions were never trained (or, for learned
    positions, do not exist)."""
    config = model.config or {}
    for key in ("rope_scaling", "rope_parameters"):
        scaling = config.get(key)
        if not isinstance(scaling, dict):
            continue
        kind, factor = scaling.get("rope_type", scaling.get("type")), scaling.get("factor")
        if kind in (None, "default") or not isinstance(factor, (int, float)) or factor <= 1:
            continue
        original = scaling.get("original_max_position_embeddings") or config.get("original_max_position_embeddings")
        trained = original if isinstance(original, int) and original > 0 else model.max_position_embeddings
        return max(model.max_position_embeddings, int(factor * trained)), f"{kind} rope scaling"
    return model.max_position_embeddings, ""


def moe_lora_problems(recipe: Recipe) -> list[Problem]:
    """PEFT adapts an MoE layer's fused 3-D experts with its ParamWrapper, which refuses LoRA dropout (PEFT 0.21:
    "lora.ParamWrapper does not work with lora_dropout != 0"); found by dry-running the Qwen3-MoE LoRA preset."""
    mode = recipe.mode
    if not recipeview.trains_adapter(mode.kind) or not recipe.model.moe:
        return []
    lora = mode.lora  # type: ignore[union-attr]
    if lora.target_modules != "all-linear" or lora.dropout == 0:
        return []
    return [
        Problem(
            "mode.lora.dropout",
            f"LoRA dropout {lora.dropout:g} on the MoE model {recipe.model.name} with all-linear targets: PEFT adapts "
            "the fused experts with its ParamWrapper, which works only without dropout",
            hint="mode.lora.dropout=0, or name the attention projections in mode.lora.target_modules",
        )
    ]


def streaming_problems(recipe: Recipe, layout: Layout, total_steps: int | None) -> list[Problem]:
    """What ``data.streaming`` cannot do. An iterable dataset has no length, so the Trainer needs the step count up
    front; no split can be held out without preparing the rows first; and a tensor-parallel group must see one
    batch on all its ranks, which the stream's reading (every rank keeps its share of the rows) does not give."""
    data = recipe.data
    if not data.streaming:
        return []
    problems = []
    if total_steps is None:
        problems.append(
            Problem(
                "data.streaming",
                "a streamed dataset has no length, so the run needs its step count up front, and none is known",
                hint="set train.max_steps, or data.num_samples (estimate) or data.num_rows (exact)",
            )
        )
    if data.eval_fraction > 0:
        problems.append(
            Problem(
                "data.eval_fraction",
                f"{data.eval_fraction} with data.streaming: no split can be held out without preparing the data",
                hint="0 under streaming; or prepare the data (data.streaming=false) for an eval split",
            )
        )
    if layout.tensor_parallel > 1:
        problems.append(
            Problem(
                "data.streaming",
                f"streaming with parallel.tensor_parallel {layout.tensor_parallel}: the ranks of a TP group must "
                "train on the same rows, and the stream gives each rank its own share",
                hint="parallel.tensor_parallel=1 with streaming, or prepare the data (data.streaming=false)",
            )
        )
    if recipe.ops.nonfinite_loss == "skip":
        problems.append(
            Problem(
                "ops.nonfinite_loss",
                "skip with data.streaming: a stream is read in its stored order, so no resume can leave one step's "
                "batch out of it",
                hint="stop (the Job ends with the batch kept) or warn under streaming; or prepare the data "
                "(data.streaming=false) to skip",
            )
        )
    return problems


def volume_problems(recipe: Recipe) -> list[Problem]:
    """The model and data must be on the pod's shared volume (or in the image): a path on no volume is a file the
    pods never see (:mod:`recipekit.recipe.volumes`, the rule validate applies to a built Job too)."""
    mount = recipe.cluster.mount_path
    paths = {"model.name_or_path": recipe.model.name_or_path, "data.path": recipe.data.path}
    return [
        Problem(
            key,
            f"{path} is on no volume of the pod: the shared volume is mounted at {mount} (cluster.mount_path)",
            hint=f"put it under {mount}",
        )
        for key, path in off_volumes(paths, [mount])
    ]


def mount_problems(recipe: Recipe) -> list[Problem]:
    """Every volume of the pod gets its own mount path: Kubernetes rejects a pod that mounts two volumes at one path
    (a host mount at the PVC's mount path, or at the NVMe scratch directory)."""
    par = recipe.parallel
    claimed = {recipe.cluster.mount_path.rstrip("/"): "cluster.mount_path"}
    if par.nvme_path and "nvme" in (par.offload_optimizer, par.offload_param):
        nvme = par.nvme_path.rstrip("/")
        if nvme in claimed:
            return [Problem("parallel.nvme_path", f"{par.nvme_path} is also {claimed[nvme]}", "a local NVMe directory")]
        claimed[nvme] = "parallel.nvme_path"
    return [
        Problem("hw.host_mounts", f"{path} is also {claimed[path.rstrip('/')]}", hint="mount paths must differ")
        for path in recipe.hw.host_mounts
        if path.rstrip("/") in claimed
    ]


def pod_label_problems(recipe: Recipe) -> list[Problem]:
    """A team's extra pod label may not change one the hardware needs (hw.pod_labels: the device scheduler's)."""
    return [
        Problem(
            f"cluster.pod_labels.{key}",
            f"is a label hw.pod_labels sets ({recipe.hw.name}: {key}={recipe.hw.pod_labels[key]}), which the device "
            "scheduler reads",
            hint="choose another key",
        )
        for key in recipe.cluster.pod_labels
        if key in recipe.hw.pod_labels
    ]
