"""The prepared shards as the dataset Bridge's data loader reads (its ``DatasetProvider`` hook), imported only once
Bridge is (it subclasses Bridge's own class). Bridge's ``single`` data loader hands consecutive samples (rows.py) to
the data-parallel ranks and resumes at the checkpoint's ``consumed_train_samples``: the first row after a resume is
the one that followed the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from megatron.bridge.training.config import DatasetBuildContext, DatasetProvider

from .rows import OrderedRows


@dataclass
class PreparedShards(DatasetProvider):
    """Bridge's dataset hook over the prepared train split (no validation or test split: ``eval_iters`` 0)."""

    split: Any = None
    seed: int = 0
    seq_length: int = 0
    pad_id: int = 0
    packed: bool = False
    skip_getting_attention_mask_from_dataset: bool = True
    dataloader_type: str | None = "single"
    num_workers: int = 0
    pin_memory: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.skip_getting_attention_mask_from_dataset = not self.packed

    def build_datasets(self, context: DatasetBuildContext) -> tuple[Any, Any, Any]:
        rows = OrderedRows(self.split, context.train_samples, self.seed, self.seq_length, self.pad_id)
        return rows, None, None
