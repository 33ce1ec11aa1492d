"""How much data one epoch is: training rows (for the schedule) and tokens (for time and cost), exact or estimated.

The plan computes these once (``plan.data``), from the recipe's data section, and everything else reads them: the
schedule (steps per epoch, warmup), the time and cost figures of ``recipekit plan`` and ``plan.md``. The most exact
number the recipe has wins:

* rows: ``data.num_rows`` (exact: what a prepared manifest says, pasted by ``recipekit data prepare`` or applied by
  ``recipekit plan --data``); else, for packed SFT and pretraining blocks, ``data.num_tokens`` / ``max_len`` (each
  row holds at most max_len tokens, so this is a lower bound); else ``data.num_samples`` less the eval fraction;
* tokens: ``data.num_tokens``; else rows × ``max_len`` (an upper bound: rows are at most max_len tokens long).

Steps per epoch follow the Trainer's own count, so an exact row count gives the exact schedule the run will have.
Pure arithmetic on the recipe; a leaf module like :mod:`recipekit.plan.layout`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from recipekit.plan.layout import Layout
from recipekit.recipe.sections import DataSpec


@dataclass(frozen=True)
class DataSize:
    """Training rows and tokens of one epoch, and where each number comes from."""

    rows: int | None
    tokens: int | None
    rows_from: str  # the recipe key (or arithmetic) the row count comes from; "" when unknown
    tokens_from: str

    @property
    def exact(self) -> bool:
        """Rows and tokens as a prepared manifest counted them."""
        return self.rows_from == "data.num_rows" and self.tokens_from == "data.num_tokens"

    @property
    def tokens_per_row(self) -> float | None:
        return self.tokens / self.rows if self.rows and self.tokens else None

    def summary(self) -> dict[str, object]:
        return {"rows": self.rows, "tokens": self.tokens, "rows_from": self.rows_from, "tokens_from": self.tokens_from}


def data_size(data: DataSpec) -> DataSize:
    """Rows and tokens per epoch of the training split, as exact as the recipe allows (see the module docstring)."""
    rows_by_tokens = data.packing or data.format == "text"
    if data.num_rows:
        rows, rows_from = data.num_rows, "data.num_rows"
    elif data.num_tokens and rows_by_tokens:
        rows, rows_from = math.ceil(data.num_tokens / data.max_len), "data.num_tokens / data.max_len"
    elif data.num_samples:
        rows = max(1, math.floor(data.num_samples * (1 - data.eval_fraction)))
        rows_from = "data.num_samples" + (" × (1 − data.eval_fraction)" if data.eval_fraction else "")
    else:
        rows, rows_from = None, ""
    if data.num_tokens:
        tokens, tokens_from = data.num_tokens, "data.num_tokens"
    elif rows:
        tokens, tokens_from = rows * data.max_len, "rows × data.max_len"
    else:
        tokens, tokens_from = None, ""
    return DataSize(rows, tokens, rows_from, tokens_from)


def steps_per_epoch(rows: int, layout: Layout) -> int:
    """Optimizer steps in one epoch of ``rows``, as the Trainer counts them: ceil(rows / micro batch) batches dealt
    round-robin over the data-parallel ranks (each gets as many as the busiest: Accelerate evens them out), then
    gradient_accumulation_steps batches per step, a last shorter step included."""
    batches = math.ceil(rows / layout.micro_batch_size)
    per_rank = math.ceil(batches / layout.dp_size)
    return max(1, math.ceil(per_rank / layout.gradient_accumulation_steps))
