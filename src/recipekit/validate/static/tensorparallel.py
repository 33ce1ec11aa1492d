"""Tensor parallelism in a built bundle: TP × DP = world size, TP inside a pod, and the ds_config asking DeepSpeed
for exactly the plan's AutoTP.

The plan decides TP once (:mod:`recipekit.plan.parallelism`), and the ds_config, the Trainer arguments and recipe.yaml's
numbers are rendered from it; a hand edit of one of them (an ``autotp_size`` changed in ds_config, a world size
changed in the Job) would make the ranks disagree about who holds which slice, which DeepSpeed reports, if at all,
as a shape error deep in the first step. Transformers' and DeepSpeed's own reading of the ds_config runs in
:mod:`recipekit.validate.static.librarychild`.
"""

from __future__ import annotations

from recipekit.bundle.files import DS_CONFIG as DS
from recipekit.bundle.files import RECIPE
from recipekit.plan.parallelism import AUTOTP_ZERO_STAGES
from recipekit.validate.shared.loader import Bundle
from recipekit.validate.shared.results import Result, Status


def _autotp_size(ds: dict | None) -> int | None:
    section = (ds or {}).get("tensor_parallel")
    if not isinstance(section, dict):
        return None
    value = section.get("autotp_size")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


CHECK_ID = "consistency.tensor-parallel"
TITLE = "TP × DP = world size, TP inside a pod, ds_config AutoTP = plan TP (ZeRO 0-2, weights gathered on save)"


def check_tensor_parallel(bundle: Bundle) -> Result:
    """TP × DP = world size, TP inside a pod and dividing the heads, ds_config's AutoTP = the plan's TP under
    DeepSpeed at ZeRO 0-2, full weights gathered on save, no fixed train_batch_size."""
    if "megatron" in (bundle.doc or {}):
        return Result(CHECK_ID, TITLE).skip(
            "a bundle of the Megatron engine: its TP is Megatron's (consistency.megatron checks it)"
        )
    return _trainer_tensor_parallel(bundle, Result(CHECK_ID, TITLE))


def _trainer_tensor_parallel(bundle: Bundle, result: Result) -> Result:
    plan, ds = bundle.plan, bundle.ds_config
    tp = plan.get("tensor_parallel", 1)
    autotp = _autotp_size(ds)
    if not isinstance(tp, int) or not plan:
        return result.skip("needs recipe.yaml's plan")
    if tp == 1 and autotp in (None, 0, 1):
        result.reason = "no tensor parallelism (plan.tensor_parallel = 1, no AutoTP in ds_config)"
        return result
    world, dp, per_pod = plan.get("world_size"), plan.get("dp_size"), plan.get("devices_per_pod")
    if all(isinstance(v, int) for v in (world, dp)) and tp * dp != world:
        result.fail(RECIPE, "plan.dp_size", f"TP {tp} × DP {dp} = {tp * dp}, but plan.world_size = {world}")
    if isinstance(per_pod, int) and per_pod % tp:
        result.fail(
            RECIPE,
            "plan.tensor_parallel",
            f"TP {tp} does not divide the {per_pod} devices of a pod: a TP group would span pods and all-reduce "
            "over the network every layer",
        )
    if bundle.recipe is not None:
        model = bundle.recipe.model
        if model.num_attention_heads % tp or model.num_kv_heads % tp:
            result.fail(
                RECIPE,
                "plan.tensor_parallel",
                f"TP {tp} does not divide {model.name}'s {model.num_attention_heads} attention heads and "
                f"{model.num_kv_heads} key/value heads",
            )
        if bundle.recipe.parallel.tensor_parallel != tp:
            result.fail(
                RECIPE,
                "plan.tensor_parallel",
                f"{tp}, but recipe.parallel.tensor_parallel = {bundle.recipe.parallel.tensor_parallel}",
            )
    if not bundle.args.get("deepspeed") or ds is None:
        result.fail(
            RECIPE,
            "training_arguments.deepspeed",
            f"not set (or {DS} unreadable), but plan.tensor_parallel = {tp}: AutoTP comes from the ds_config",
        )
        return result
    if autotp != tp:
        result.fail(
            DS,
            "tensor_parallel.autotp_size",
            f"{autotp}, but {RECIPE} plan.tensor_parallel = {tp}: the Trainer and DeepSpeed read the TP degree here",
        )
    zero = (ds.get("zero_optimization") or {}) if isinstance(ds.get("zero_optimization"), dict) else {}
    if zero.get("stage", 0) not in AUTOTP_ZERO_STAGES:
        result.fail(
            DS,
            "zero_optimization.stage",
            f"{zero.get('stage')} with AutoTP: transformers' ZeRO-3 loading refuses a tensor_parallel ds_config",
            hint="ZeRO 0, 1 or 2",
        )
    if zero.get("stage3_gather_16bit_weights_on_model_save") is not True:
        result.fail(
            DS,
            "zero_optimization.stage3_gather_16bit_weights_on_model_save",
            "must be true under AutoTP: Accelerate gathers the TP-sliced weights only then, and the Trainer "
            "otherwise saves a DeepSpeed checkpoint in place of the model",
        )
    if isinstance(ds.get("train_batch_size"), int):
        result.fail(
            DS,
            "train_batch_size",
            f"{ds['train_batch_size']} under TP {tp}: the Trainer's check counts every TP rank as data-parallel "
            f"(world × micro × accumulation) while the global batch is {plan.get('global_batch_size')} "
            "(micro × accumulation × DP)",
            hint="leave it out: DeepSpeed derives it",
        )
    if result.status is Status.PASS:
        result.reason = f"TP {tp} × DP {dp} = world size {world}, AutoTP {autotp}, ZeRO-{zero.get('stage', 0)}"
    return result
