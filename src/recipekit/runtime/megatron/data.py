"""The engine's training data: the runtime's own prepared shards (runtime/data/), read through a dataset Bridge
accepts (provider.py), so that both engines train on the very same rows in the very same order.

Why the runtime's shards and not Megatron's indexed dataset: they are already tokenised, masked (SFT prompts),
blocked or packed, fingerprinted and signed on the volume (data/workers.py, volume/manifest.py), shared by every run
whose data, tokenizer and row settings are equal; the order of the rows is a keyed permutation per epoch
(boundary/order.py) that any position of which can be computed, so the engine's sampler (Megatron's sequential one,
resumed at ``consumed_train_samples``) lands on exactly the row that followed the checkpoint. A conversion to
Megatron's ``.bin/.idx`` would be a second copy of the same tokens and lose the SFT masks (GPTDataset has no labels
of its own).

Every rank prepares its share of the chunks before the process group forms (nothing waits in a collective while a
corpus is tokenised), or all of them reuse what an earlier run, the Trainer's engine or ``recipekit data prepare``
left there: the same steps as the Trainer's session/rundata.py, whose functions this room may not import (they
belong to the Trainer's session layer).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..boundary import filenames
from ..boundary.common import RunError, log0, rank
from ..boundary.recipeview import DataView, RecipeView
from ..data.fingerprint import Settings, fingerprint, inputs, tokenizer_digest
from ..data.shards import ShardDataset, token_dtype
from ..data.sources import find_files, first_records, plan_chunks
from ..data.workers import Job, collect, work

#: Seconds between the other ranks' looks for the twin rank 0 is writing.
TWIN_POLL_S = 1.0
#: Records the twin's tokenizer is trained on (as the Trainer's twin).
TOKENIZER_SAMPLE_LIMIT = 50_000


@dataclass
class Prepared:
    """The model's directory and tokenizer, the train split and how it came to be."""

    model_path: str
    tokenizer: Any
    train: ShardDataset
    manifest: dict[str, Any]
    directory: Path
    reused: bool
    seconds: float
    workers: int  # the ranks that prepared it (0: reused)

    def summary(self) -> dict[str, Any]:
        """The ``data`` record of metrics.jsonl (the Trainer's fields, ``workers`` the ranks that prepared it)."""
        split = self.manifest["splits"]["train"]
        return {
            "fingerprint": self.manifest["fingerprint"],
            "directory": str(self.directory),
            "reused": self.reused,
            "workers": self.workers,
            "chunks": self.manifest["chunks"],
            "row_kind": self.manifest["row_kind"],
            "train_rows": split["rows"],
            "train_tokens": split["tokens"],
            "records": self.manifest["records"],
            "seconds": round(self.seconds, 2),
        }


def settings_of(data: DataView, seed: int) -> Settings:
    """The prepare settings of recipe.yaml's data section: equal to the Trainer's for equal recipes, so both engines
    find the same fingerprint (packing means nothing to pretraining blocks)."""
    if data.streaming:
        raise RunError("data.streaming: the Megatron engine trains on prepared shards; build with data.streaming=false")
    return Settings(
        format=data.format,
        max_len=int(data.max_len),
        packing=bool(data.packing) and data.format != "text",
        eval_fraction=float(data.eval_fraction),
        seed=int(seed),
        chunk_bytes=max(1, int(float(data.shard_mib) * 2**20)),
        max_bad_records=int(data.max_bad_records),
        check=str(data.fingerprint),
    )


def model_source(recipe: RecipeView, settings: Settings, files: list[Any], output_dir: Path, seed: int) -> str:
    """The HF model directory the engine starts from: ``model.name_or_path``, or the random twin in ``output_dir``
    (rank 0 writes it, the others wait for it to appear whole)."""
    if recipe.model.init != "random":
        return str(recipe.model.name_or_path)
    from ..model.twin import corpus_texts
    from .twin import create_random_init

    destination = output_dir / filenames.RANDOM_INIT_DIR
    if rank() == 0:
        chunks = plan_chunks(files, settings.chunk_bytes)
        records = first_records(files, chunks, settings.format, TOKENIZER_SAMPLE_LIMIT)
        create_random_init(recipe.model, corpus_texts(records, settings.format), seed, destination)
    else:
        while not (destination / "config.json").is_file():
            time.sleep(TWIN_POLL_S)
    return str(destination)


def prepare(recipe: RecipeView, prepared_root: Path, output_dir: Path, seed: int) -> Prepared:
    """Every rank: the model directory, its tokenizer and the prepared train split (prepared here by all ranks
    together when no earlier run left it)."""
    from transformers import AutoTokenizer

    started = time.monotonic()
    settings = settings_of(recipe.data, seed)
    files = find_files(str(recipe.data.path), recipe.data.format)
    model_path = model_source(recipe, settings, files, output_dir, seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=recipe.model.trust_remote_code)
    largest = max(len(tokenizer) - 1, max(tokenizer.get_vocab().values(), default=0))
    described = inputs(settings, files, tokenizer_digest(tokenizer))
    name = fingerprint(described)
    chunks = plan_chunks(files, settings.chunk_bytes)
    job = Job(prepared_root / name, name, described, files, chunks, settings, token_dtype(largest))
    found = job.existing()
    reused = found is not None
    world = 0 if reused else int(os.environ.get("WORLD_SIZE", "1"))
    if found is None:
        log0(
            "preparing the data: %d files in %d chunks over %d rank(s) into %s",
            len(files),
            len(chunks),
            world,
            job.directory,
        )
        work(job, tokenizer, rank(), world)
        found = collect(job, merger=rank() == 0)
    else:
        log0("prepared data found in %s (fingerprint %s): reusing it", job.directory, name)
    train = ShardDataset(job.directory, found, "train")
    if not len(train):
        raise RunError(f"the prepared data in {job.directory} has no training rows: more data, or a shorter max_len")
    return Prepared(model_path, tokenizer, train, found, job.directory, reused, time.monotonic() - started, world)
