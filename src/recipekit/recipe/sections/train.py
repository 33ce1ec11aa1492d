"""The ``train`` section: optimisation and bookkeeping (steps, learning rate, precision, checkpoints, trackers)."""

from __future__ import annotations

from typing import Literal

from recipekit.recipe.schema import Section, spec
from recipekit.recipe.sections.model import MAX_COUNT


# --------------------------------------------------------------------------------------------------------- train
class TrainSpec(Section):
    """Optimisation and bookkeeping; the Trainer arguments are derived from these by the plan."""

    micro_batch_size: int = spec(1, gt=0, le=65_536, description="Sequences per device per step.")
    gradient_accumulation_steps: int | None = spec(
        None,
        gt=0,
        le=1_048_576,
        description="Micro-steps per optimizer step; derived from global_batch_size when unset.",
    )
    global_batch_size: int | None = spec(
        None, gt=0, le=2**30, description="Sequences per optimizer step across all devices."
    )
    epochs: float = spec(1.0, gt=0, le=1e6, description="Passes over the data (ignored when max_steps is set).")
    max_steps: int | None = spec(None, gt=0, le=MAX_COUNT, description="Optimizer steps; overrides epochs.")
    learning_rate: float = spec(2e-5, gt=0, lt=1, description="Peak learning rate.")
    lr_scheduler: Literal["cosine", "linear", "constant_with_warmup"] = spec("cosine", description="LR schedule.")
    warmup_ratio: float = spec(0.03, ge=0, lt=1, description="Fraction of steps spent warming up.")
    weight_decay: float = spec(0.0, ge=0, le=100, description="AdamW weight decay.")
    max_grad_norm: float = spec(1.0, gt=0, le=1e6, description="Gradient clipping norm.")
    precision: Literal["auto", "bf16", "fp16", "fp32", "fp8"] = spec(
        "auto",
        description="auto: bf16 where supported; fp8: bf16 weights with FP8 matrix multiplies where the hardware has "
        "FP8 (hw.peak_tflops_fp8; analysed by plan only).",
    )
    save_steps: int = spec(500, gt=0, le=MAX_COUNT, description="Checkpoint every N optimizer steps.")
    save_total_limit: int = spec(3, gt=0, le=100_000, description="Checkpoints kept (oldest deleted first).")
    logging_steps: int = spec(10, gt=0, le=MAX_COUNT, description="Log every N optimizer steps.")
    seed: int = spec(42, ge=0, le=2**32 - 1, description="Random seed (NumPy's seeds are 32-bit).")
    report_to: list[Literal["tensorboard", "wandb", "mlflow", "none"]] = spec(
        default_factory=lambda: ["tensorboard"], description="Trackers the Trainer reports to."
    )
    dataloader_workers: int = spec(4, ge=0, le=1024, description="DataLoader worker processes per device.")
    profile_steps: tuple[int, int] | None = spec(
        None,
        description="[first, last]: record a torch profiler trace (torch_npu's on Ascend) of these optimizer steps "
        "into output_dir/profile/ (keep the window short: a trace grows by megabytes per step).",
    )

    def rules(self) -> list[str]:
        if self.profile_steps is not None:
            first, last = self.profile_steps
            if not 1 <= first <= last:
                return [f"profile_steps {list(self.profile_steps)}: need 1 <= first <= last (steps count from 1)"]
        return []
