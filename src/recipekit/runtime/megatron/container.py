"""Bridge's ``ConfigContainer`` for this run: Bridge's own base recipe, the model provider AutoBridge makes from the HF
model directory, then recipe.yaml's ``megatron`` document on top (boundary/megatronview.py), then what only this
run knows (its paths, the prepared data, the checkpoint it resumes).

The base recipes are Bridge's (``megatron.bridge.recipes.common``): ``_pretrain_common`` for ``pretrain``,
``_sft_common`` / ``_peft_common`` for ``finetune``; every model recipe Bridge ships starts from one of them. The
document overrides only the fields it names; a field Bridge no longer has is an error naming it (an engine upgrade
renamed it), never silently dropped. Imported once Bridge is (the dry run's CPU redirect first, where it applies).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..boundary.common import RunError
from ..boundary.megatronview import MegatronDoc
from .checkpoints import CHECKPOINTS_DIR, Choice
from .data import Prepared

#: Where Bridge writes its own logs (TensorBoard) below the output directory.
TENSORBOARD_DIR = "runs"


def base_recipe(doc: MegatronDoc) -> Any:
    """Bridge's base ConfigContainer for the document's entry."""
    from megatron.bridge.recipes import common

    if doc.entry == "pretrain":
        return common._pretrain_common()
    return common._peft_common() if doc.peft is not None else common._sft_common()


def provider(model_path: str, trust_remote_code: bool) -> tuple[Any, Any]:
    """AutoBridge for the HF directory and the GPT provider it makes from the HF config.

    Without weights: they come from the imported Megatron checkpoint (hfimport.py) or the checkpoint resumed. Bridge
    0.3.1's ``to_megatron_provider(load_weights=True)`` builds the model with ``perform_initialization=False``, and
    Megatron-core's parallel linear layers mark their weights ``tensor_model_parallel`` only while initialising them
    (tensor_parallel/layers.py): the gradient norm (and so clipping) then counts a TP-split weight once, not per
    shard, and a run differs from itself resumed (found by this room's resume test at TP 2)."""
    from megatron.bridge import AutoBridge

    bridge = AutoBridge.from_hf_pretrained(model_path, trust_remote_code=trust_remote_code)
    return bridge, bridge.to_megatron_provider(load_weights=False)


def apply(section: Any, values: dict[str, Any], where: str) -> None:
    """Set each field of ``values`` on a Bridge config object; one it lacks is a RunError naming it."""
    for name, value in values.items():
        if not hasattr(section, name):
            raise RunError(
                f"megatron.{where}.{name}: this Megatron-Bridge has no such field ({type(section).__name__})"
            )
        if name == "attention_backend":
            from megatron.core.transformer.enums import AttnBackend

            value = AttnBackend[value]
        setattr(section, name, value)


def layer_spec(model: Any, fields: Any) -> None:
    """Megatron-core's local layer spec for ``transformer_impl: local`` (the provider's is Transformer Engine's)."""
    if fields.get("transformer_impl") == "local":
        from megatron.bridge.models.gpt_provider import local_layer_spec

        model.transformer_layer_spec = local_layer_spec


def build(
    doc: MegatronDoc, model: Any, prepared: Prepared, output_dir: Path, choice: Choice, init_dir: Path | None
) -> Any:
    """The run's ConfigContainer: base recipe, provider, document, paths, data, resume point."""
    from megatron.bridge.training.config import DistributedInitConfig, TokenizerConfig

    from .provider import PreparedShards

    cfg = base_recipe(doc)
    cfg.model = model
    cfg.dist = cfg.dist or DistributedInitConfig()
    for name, values in doc.sections.items():
        apply(getattr(cfg, name), dict(values), name)
    layer_spec(cfg.model, doc.sections["model"])
    cfg.mixed_precision = doc.mixed_precision
    if doc.mixed_precision is None:  # fp32: the provider's dtypes follow the HF config otherwise
        cfg.model.bf16 = cfg.model.fp16 = False
        cfg.optimizer.bf16 = cfg.optimizer.fp16 = False
        cfg.model.params_dtype = cfg.model.pipeline_dtype = __import__("torch").float32
    cfg.peft = _lora(doc) if doc.peft is not None else None
    cfg.tokenizer = TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=prepared.model_path)
    seq_length = int(doc.get("model", "seq_length"))
    cfg.dataset = PreparedShards(
        split=prepared.train,
        seed=int(doc.get("rng", "seed")),
        seq_length=seq_length,
        pad_id=int(prepared.tokenizer.pad_token_id or 0),
        packed=prepared.manifest["row_kind"] == "packed",
    )
    checkpoints = str(output_dir / CHECKPOINTS_DIR)
    cfg.checkpoint.save = checkpoints
    cfg.checkpoint.load = checkpoints if choice.path is not None else None
    cfg.checkpoint.ckpt_step = choice.step
    cfg.checkpoint.pretrained_checkpoint = str(init_dir) if init_dir is not None else None
    cfg.checkpoint.async_save = False  # rank 0 signs a checkpoint once its save has returned on every rank
    cfg.logger.tensorboard_dir = str(output_dir / TENSORBOARD_DIR)
    cfg.train.eval_iters = int(doc.get("train", "eval_iters", 0))
    return cfg


def _lora(doc: MegatronDoc) -> Any:
    from megatron.bridge.peft.lora import LoRA

    lora = doc.peft
    assert lora is not None
    return LoRA(target_modules=list(lora.target_modules), dim=lora.dim, alpha=lora.alpha, dropout=lora.dropout)
