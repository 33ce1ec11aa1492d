"""The model to train and its tokenizer: loaded in the right dtype, optionally 4-bit, wrapped in LoRA; the merge.

``weight_dtype`` is the rule recipekit's memory estimate assumes for the weights' dtype; the merged copy is made
from an unquantised base, so it holds real weights even after QLoRA.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..boundary.common import RunError, log0, precision
from ..boundary.config import RunConfig
from ..boundary.recipeview import ModelView, ModeView, RecipeView, trains_adapter
from ..data.chat import CHAT_TEMPLATE
from .shrink import lora_target_modules, lora_target_parameters, moe_leaf_classes

#: The recipe's 16-bit precisions as torch dtypes (fp32 is everything else).
HALF_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def router_settings(spec: ModelView) -> dict[str, Any]:
    """Config overrides for an MoE model: the recipe's load-balancing loss and its weight (empty for a dense one)."""
    if not spec.num_experts:
        return {}
    return {
        "output_router_logits": bool(spec.router_aux_loss),
        "router_aux_loss_coef": float(spec.router_aux_loss_coef),
    }


def mark_moe_leaves(model: Any, zero_stage: int) -> list[str]:
    """Under ZeRO-3, make every MoE block a ZeRO-3 leaf module; the class names marked.

    ZeRO-3 fetches parameters module by module as forward reaches them; an MoE block runs only the experts its
    tokens were routed to, so ranks fetch different experts and the collective fetches never match (the run
    hangs). Marked as leaves, each block's parameters are fetched whole, on every rank alike. The blocks are found
    from the module tree (:func:`.shrink.moe_leaf_classes`: the module holding the routed experts beside their
    router), for any architecture."""
    if zero_stage != 3:
        return []
    wanted = set(moe_leaf_classes(model))
    classes = {type(m) for m in model.modules() if type(m).__name__ in wanted}
    if not classes:
        return []
    from deepspeed.utils import set_z3_leaf_modules

    set_z3_leaf_modules(model, sorted(classes, key=lambda c: c.__name__))
    names = sorted(c.__name__ for c in classes)
    log0("zero-3: %s marked as leaf modules (each fetched whole: ranks route tokens to different experts)", names)
    return names


def load_tokenizer(path: str, trust_remote_code: bool) -> Any:
    """The model's tokenizer, given a pad token and a chat template if it lacks them (both logged)."""
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if not getattr(tokenizer, "is_fast", False):
        raise RunError(f"the tokenizer of {path} is not a fast tokenizer: prompt masking needs offset mappings")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
        log0("tokenizer has no pad token: padding with eos (%s); padding is never in the loss", tokenizer.eos_token)
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
        log0("tokenizer has no chat template: using recipekit's plain <|role|> template")
    return tokenizer


def weight_dtype(precision: str, mode: str, deepspeed: bool) -> torch.dtype:
    """The dtype weights are loaded in.

    Half precision when the loaded weights are never updated in place by a plain optimizer: a frozen LoRA base
    (adapters stay fp32), or DeepSpeed, which keeps its own fp32 master copy. Full training under the Trainer's AMP
    needs fp32 weights: AMP computes in half precision but has no master copy.
    """
    half = HALF_DTYPES.get(precision)
    if half is not None and (trains_adapter(mode) or deepspeed):
        return half
    return torch.float32


def quantization_config(mode: ModeView, device_kind: str, compute_dtype: torch.dtype) -> Any:
    """bitsandbytes 4-bit loading for QLoRA, or None (logged) where it cannot run: then the run is plain LoRA."""
    quant = mode.quant  # recipeview.ModeView: present exactly when the mode is qlora
    if mode.kind != "qlora" or quant is None:
        return None
    if device_kind == "cpu":
        log0("qlora: 4-bit loading needs an accelerator; training plain LoRA on the unquantised model")
        return None
    try:
        import bitsandbytes  # noqa: F401
        from transformers import BitsAndBytesConfig
    except ImportError as exc:
        log0("qlora: bitsandbytes unavailable (%s); training plain LoRA on the unquantised model", exc)
        return None
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=quant.quant_type,
        bnb_4bit_use_double_quant=quant.double_quant,
        bnb_4bit_compute_dtype=compute_dtype,
    )


def load_model(path: str, run: RunConfig, args: Any, device_kind: str) -> Any:
    """The model to train: loaded, optionally quantised, and wrapped in a LoRA adapter for lora/qlora."""
    recipe = run.recipe
    mode = recipe.mode
    dtype = weight_dtype(precision(args), mode.kind, run.uses_deepspeed)
    quant = quantization_config(mode, device_kind, dtype)
    extra = {"quantization_config": quant, "device_map": {"": args.device}} if quant else {}
    extra.update(router_settings(recipe.model))
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, trust_remote_code=recipe.model.trust_remote_code, **extra
    )
    model.config.use_cache = False  # a KV cache in training would also disable the packed-sequence mask
    mark_moe_leaves(model, run.zero_stage)
    if not trains_adapter(mode.kind):
        return model
    from peft import LoraConfig, prepare_model_for_kbit_training

    if quant:
        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=bool(args.activation_checkpointing),
            gradient_checkpointing_kwargs=args.activation_checkpointing_kwargs,
        )
    elif args.activation_checkpointing:
        model.enable_input_require_grads()  # checkpointed blocks need an input that requires grad
    lora = mode.lora
    if lora is None:  # recipeview.ModeView refuses an adapter mode without it; this narrows the type
        raise RunError(f"recipe.mode.lora is missing for mode {mode.kind}")
    config = LoraConfig(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, task_type="CAUSAL_LM", **lora_targets(model, lora)
    )
    return adapted(model, config, lora.target_modules)


def adapted(model: Any, config: Any, targets: Any) -> Any:
    """``model`` wrapped by PEFT in the adapter ``config``; targets PEFT cannot find are the recipe's mistake, not a
    failure a restart heals: a RunError (exit 2, the Job's TerminateJob), naming the modules the model has, rather
    than PEFT's ValueError (exit 1, which Volcano restarts up to maxRetry times). `build` refuses such targets where
    the model option records its modules (plan/adapters.py); this is the check for the rest."""
    from peft import get_peft_model

    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        message = " ".join(str(exc).split())
        if "target" not in message.lower():
            raise
        have = ", ".join(lora_target_modules(model)) or "none"
        raise RunError(
            f"recipe.mode.lora.target_modules {targets}: {message[:300]} (the model's layers have: {have}; rebuild "
            "the bundle with names among them, or all-linear)"
        ) from None


def lora_targets(model: Any, lora: Any) -> dict[str, Any]:
    """PEFT's targets for ``lora`` (``recipe.mode.lora``): the recipe's own names where it gives them, else, for
    ``all-linear``, every attention and MLP projection of the decoder layers found in the module tree
    (:func:`.shrink.lora_target_modules`) and the fused routed experts' weights
    (:func:`.shrink.lora_target_parameters`); never a router (adapting it changes which experts a token uses) nor
    the output head. Logged, so a run says what it adapts.

    PEFT 0.21 under transformers 5 reads ``gate_proj``/``up_proj``/``down_proj`` of the MoE families whose experts
    transformers fused (Mixtral, Qwen2-MoE and those converted like it: Qwen3-MoE, DeepSeek-V3) as the fused experts'
    weights, whatever else carries those names, so there the dense first layers' and the shared experts' MLPs are
    not adapted (the plan counts no MLP modules in an MoE model either: ``plan.modelsize.lora_params``). That is
    PEFT's conversion for adapters trained under transformers 4 (huggingface/peft#3711, fixed in no release yet)."""
    if lora.target_modules != "all-linear":
        return {"target_modules": lora.target_modules}
    modules = lora_target_modules(model)
    if not modules:  # no nn.Linear in the layers (Conv1D projections): PEFT's own all-linear finds them
        return {"target_modules": "all-linear"}
    targets: dict[str, Any] = {"target_modules": modules}
    parameters = lora_target_parameters(model)
    if parameters:
        targets["target_parameters"] = parameters
    log0("lora: adapting %s (every attention and MLP projection; routers left alone)", modules + parameters)
    return targets


def parameter_counts(model: Any) -> tuple[int, int]:
    """(trainable, total) parameters; ZeRO-3 partitions report their full size in ``ds_numel``."""
    trainable = total = 0
    for parameter in model.parameters():
        count = getattr(parameter, "ds_numel", parameter.numel())
        total += count
        trainable += count if parameter.requires_grad else 0
    return trainable, total


def save_merged(path: str, output_dir: Path, recipe: RecipeView, precision: str, tokenizer: Any) -> Path:
    """Merge the saved adapter into a fresh, unquantised copy of the base and write it to output_dir/merged."""
    from peft import PeftModel

    dtype = HALF_DTYPES.get(precision, torch.float32)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=recipe.model.trust_remote_code)
    merged = PeftModel.from_pretrained(base, str(output_dir)).merge_and_unload()
    target = output_dir / "merged"
    merged.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target
