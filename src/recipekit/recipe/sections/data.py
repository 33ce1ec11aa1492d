"""The ``data`` section: where the training data is, its format, how it is cut, packed, prepared or streamed."""

from __future__ import annotations

from typing import Literal

from recipekit.recipe.domains import (
    ABSOLUTE_PATH,
    LOCATION,
    SHORT_NAME,
)
from recipekit.recipe.schema import Section, spec
from recipekit.recipe.sections.model import MAX_COUNT, MAX_DIM


# ---------------------------------------------------------------------------------------------------------- data
class DataSpec(Section):
    """Training data on the shared volume."""

    name: str = spec(domain=SHORT_NAME, description="Short name (the option's file name).")
    description: str = spec("", description="One line shown by `recipekit list data`.")
    format: Literal["alpaca", "messages", "text"] = spec(
        description="alpaca: instruction/input/output records; messages: chat records; text: raw text. Records "
        "come as JSON lines, JSON arrays, Parquet or Arrow files; text also as .txt files."
    )
    path: str = spec(
        domain=LOCATION,
        description="A file, a directory (its data files) or a glob (corpus/**/*.jsonl) on the shared volume.",
    )
    max_len: int = spec(2048, gt=0, le=MAX_DIM, description="Sequence length (truncation; block size when packing).")
    packing: bool = spec(False, description="Pack several samples into one sequence.")
    num_samples: int | None = spec(
        None,
        gt=0,
        le=MAX_COUNT,
        description="Records (pretraining: blocks) per epoch: the estimate until num_rows is set.",
    )
    num_rows: int | None = spec(
        None,
        gt=0,
        le=MAX_COUNT,
        description="Training rows per epoch, exact once the data is prepared (recipekit plan --data).",
    )
    num_tokens: int | None = spec(
        None,
        gt=0,
        le=MAX_COUNT * 2**20,
        description="Tokens of the training rows per epoch (padding excluded): time and cost figures.",
    )
    eval_fraction: float = spec(0.0, ge=0, lt=1, description="Held-out fraction for evaluation.")
    max_bad_records: int = spec(
        0,
        ge=0,
        le=MAX_COUNT,
        description="Bad records skipped (and reported) before preparing fails; 0: the first is fatal.",
    )
    shard_mib: float = spec(
        64.0, gt=0, le=65536, description="Input MiB per prepare work unit and output shard (split at record edges)."
    )
    prepared_dir: str | None = spec(
        None,
        domain=ABSOLUTE_PATH,
        description="Where prepared shards live on the shared volume, one directory per fingerprint, reused by "
        "every run with equal data, tokenizer and row settings (default: <cluster.output_dir>/prepared).",
    )
    fingerprint: Literal["stat", "content"] = spec(
        "stat",
        description="How data files are recognised for reuse: size and mtime (stat), or a sha256 of their content.",
    )
    streaming: bool = spec(
        False,
        description="Tokenise the input while training instead of preparing shards first, for a corpus the shared "
        "volume has no room for (object storage behind a FUSE mount): every rank reads the whole input and keeps its "
        "share; needs a step count (train.max_steps, or data.num_samples/num_rows) and no eval split.",
    )
