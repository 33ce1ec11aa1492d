"""Train a tiny random Llama with the real Trainer + DeepSpeed; launched by test_reshard.py under torchrun.

Every run sees the same samples in the same order (a sequential sampler), so a world-2 run with one micro-batch per
rank and a world-1 run with two accumulated micro-batches take the same optimizer steps. Per-step losses are written
to ``--losses`` as JSON ``{step: loss}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import Dataset, SequentialSampler

SEQ = 32
VOCAB = 256


class RandomTokens(Dataset):
    """Random arithmetic runs of token ids (learnable within a few steps, so the optimizer's state shows in the loss);
    labels are the inputs (the model shifts them)."""

    def __init__(self, n: int, seed: int = 1234) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        stride = torch.randint(1, 4, (n, 1), generator=g)
        self.ids = (start + stride * torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


def ds_config(stage: int, ga: int, universal: bool) -> dict:
    config: dict = {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 1_000_000,
    }
    if stage == 3:
        config["zero_optimization"] |= {"stage3_gather_16bit_weights_on_model_save": True}
    if universal:
        config["checkpoint"] = {"load_universal": True}
    return config


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--stage", type=int, required=True)
    p.add_argument("--ga", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--save-steps", type=int, default=4)
    p.add_argument("--stop-after", type=int, default=0, help="stop training after this step (0: run to max-steps)")
    p.add_argument("--resume", default="")
    p.add_argument("--universal", action="store_true")
    p.add_argument("--fresh-optimizer", action="store_true", help="resume weights and state, not the optimizer")
    p.add_argument("--losses", required=True)
    p.add_argument("--hidden", type=int, default=64, help="model width (larger only to measure disk)")
    a = p.parse_args()

    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    transformers.set_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=a.hidden,
        intermediate_size=2 * a.hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=SEQ,
    )
    model = LlamaForCausalLM(cfg)

    class Seq(Trainer):
        def _get_train_sampler(self, *args, **kwargs):  # noqa: ANN001, ANN202
            return SequentialSampler(self.train_dataset)

    class Stop(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
            if a.stop_after and state.global_step >= a.stop_after:
                control.should_training_stop = True
            return control

    if a.fresh_optimizer:
        # The control the universal resume must beat: weights, trainer state and schedule come back, the optimizer's
        # moments do not. (In universal mode ZeRO-1/2 load the moments whatever load_optimizer_states says, so they
        # are dropped after the load: torch's AdamW then starts them again from zero.)
        import transformers.trainer as trainer_module

        load = trainer_module.deepspeed_load_checkpoint

        def load_then_forget(engine, path, load_module_strict=True):  # noqa: ANN001, ANN202
            load(engine, path, load_module_strict=load_module_strict)
            engine.optimizer.optimizer.state.clear()

        trainer_module.deepspeed_load_checkpoint = load_then_forget

    args = TrainingArguments(
        output_dir=a.out,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=a.ga,
        learning_rate=1e-2,
        lr_scheduler_type="linear",
        warmup_steps=2,
        weight_decay=0.01,
        max_grad_norm=1.0,
        max_steps=a.max_steps,
        bf16=True,
        optim="adamw_torch",
        logging_steps=1,
        save_strategy="steps",
        save_steps=a.save_steps,
        seed=0,
        report_to="none",
        dataloader_num_workers=0,
        ddp_backend="gloo",
        use_cpu=True,
        disable_tqdm=True,
        deepspeed=ds_config(a.stage, a.ga, a.universal),
    )
    trainer = Seq(model=model, args=args, train_dataset=RandomTokens(256), callbacks=[Stop()])
    trainer.train(resume_from_checkpoint=a.resume or None)
    if int(os.environ.get("RANK", "0")) == 0:
        losses = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
        Path(a.losses).write_text(json.dumps({"losses": losses, "global_step": trainer.state.global_step}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
