"""The run's training data, ready before the process group forms: tokenizer, prepared shards, memory-mapped splits.

session.py calls :func:`prepare_for_run` in every rank before the Trainer's arguments join the process group. Each
rank finds the data files, the model's tokenizer (rank 0 first makes the random twin, when the recipe asks for one;
the others wait for its directory to appear) and the fingerprint of what the shards would be (fingerprint.py). When
``<prepared_dir>/<fingerprint>/manifest.json`` exists — an earlier attempt, another run with equal inputs, or
``recipekit data prepare`` ahead of time — the data is reused at once. Otherwise every rank of every pod prepares
its share of the chunks and rank 0 writes the manifest (workers.py); no collective waits meanwhile, so preparing a
large corpus can never trip ``ddp_timeout``. Either way each rank then memory-maps the splits (shards.py): start-up
reads the manifest, never the corpus. The same steps ahead of time are ``runtime/dataprep.py``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..boundary import filenames, metricslog, recipeview
from ..boundary.common import log0, rank
from ..boundary.config import RunConfig
from ..boundary.recipeview import DataView, RecipeView
from ..data.fingerprint import Settings, fingerprint, inputs, tokenizer_digest
from ..data.shards import ShardDataset, token_dtype
from ..data.sources import find_files, first_records, plan_chunks
from ..data.workers import Job, collect, snapshot, work

STREAMING_PREPARES_NOTHING = (
    "this bundle streams its data (data.streaming: true): it tokenises while training and has nothing to prepare; "
    "build it with data.streaming=false to prepare shards ahead"
)
#: Seconds between rank 0's progress lines in a run's log.
LOG_EVERY_S = 30.0
#: Seconds between the other ranks' looks for the random twin rank 0 is writing.
TWIN_POLL_S = 1.0


@dataclass
class PreparedData:
    """What training needs from the data: the model path and tokenizer, the splits, and how they came to be."""

    model_path: str
    tokenizer: Any
    train: ShardDataset
    eval: ShardDataset | None
    manifest: dict[str, Any]
    directory: Path
    reused: bool
    seconds: float

    def summary(self, workers: int) -> dict[str, Any]:
        """The ``data`` record of metrics.jsonl."""
        splits = self.manifest["splits"]
        return {
            "fingerprint": self.manifest["fingerprint"],
            "directory": str(self.directory),
            "reused": self.reused,
            "workers": workers,
            "chunks": self.manifest["chunks"],
            "row_kind": self.manifest["row_kind"],
            "train_rows": splits["train"]["rows"],
            "train_tokens": splits["train"]["tokens"],
            "eval_rows": splits["eval"]["rows"],
            "eval_tokens": splits["eval"]["tokens"],
            "records": self.manifest["records"],
            "seconds": round(self.seconds, 2),
        }


def settings_of(data: DataView, seed: int) -> Settings:
    """The prepare settings of recipe.yaml's data section (packing means nothing to pretraining blocks)."""
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


def largest_id(tokenizer: Any) -> int:
    return max(len(tokenizer) - 1, max(tokenizer.get_vocab().values(), default=0))


def describe_job(settings: Settings, files: list[Any], tokenizer: Any, prepared_root: Path) -> Job:
    """The prepared dataset these files, settings and tokenizer make, and where it lives."""
    described = inputs(settings, files, tokenizer_digest(tokenizer))
    name = fingerprint(described)
    chunks = plan_chunks(files, settings.chunk_bytes)
    return Job(prepared_root / name, name, described, files, chunks, settings, token_dtype(largest_id(tokenizer)))


def model_source(
    recipe: RecipeView, settings: Settings, files: list[Any], output_dir: Path, seed: int, maker: bool
) -> str:
    """Where the model and its tokenizer come from: ``model.name_or_path``, or the random twin in output_dir, which
    ``maker`` writes (trained on the first records of the data) while the others wait for it to appear whole."""
    if recipe.model.init != "random":
        return str(recipe.model.name_or_path)
    from ..model.twin import TOKENIZER_SAMPLE_LIMIT, corpus_texts, create_random_init

    destination = output_dir / filenames.RANDOM_INIT_DIR
    if maker:
        chunks = plan_chunks(files, settings.chunk_bytes)
        records = first_records(files, chunks, settings.format, TOKENIZER_SAMPLE_LIMIT)
        create_random_init(recipe.model, corpus_texts(records, settings.format), seed, destination)
    else:
        while not (destination / "config.json").is_file():
            time.sleep(TWIN_POLL_S)
    return str(destination)


def open_splits(job: Job, found: dict[str, Any]) -> tuple[ShardDataset, ShardDataset | None]:
    train = ShardDataset(job.directory, found, "train")
    evaluation = ShardDataset(job.directory, found, "eval")
    return train, evaluation if len(evaluation) else None


def world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


@dataclass
class StreamedData:
    """What training needs from streamed data (``data.streaming``, stream.py): the model path and tokenizer, and the
    stream, which starts where the checkpoint being resumed left off. No eval split, no row counts up front."""

    model_path: str
    tokenizer: Any
    train: Any  # stream.StreamDataset
    files: int
    input_bytes: int
    resumed_at_row: int
    seconds: float
    eval: None = None

    def summary(self, workers: int) -> dict[str, Any]:
        """The ``data`` record of metrics.jsonl: what is read, not what it yields (known only as it is read)."""
        return {
            "streaming": True,
            "files": self.files,
            "input_bytes": self.input_bytes,
            "chunks": len(self.train.chunks),
            "chunks_known": len(self.train.known),
            "row_kind": self.train.settings.row_kind,
            "start_row": self.resumed_at_row,
            "workers": workers,
            "seconds": round(self.seconds, 2),
        }


# --------------------------------------------------------------------------------------------------- in the run
def prepare_for_run(
    run: RunConfig, output_dir: Path, record: Callable[..., None], resume: Any = None
) -> PreparedData | StreamedData:
    """Every rank: the tokenizer and the prepared splits, prepared here by all ranks together when no earlier run
    left them; under ``data.streaming`` the stream instead, from where ``resume`` (the checkpoint choice: path and
    step) left off. ``record(kind, **fields)`` appends rank 0's structured records to metrics.jsonl."""
    from ..model.loader import load_tokenizer

    recipe, me, size = run.recipe, rank(), world()
    seed = int(run.training_arguments.get("seed", 42))
    started = time.monotonic()
    settings = settings_of(recipe.data, seed)
    files = find_files(str(recipe.data.path), recipe.data.format)
    model_path = model_source(recipe, settings, files, output_dir, seed, maker=me == 0)
    tokenizer = load_tokenizer(model_path, recipe.model.trust_remote_code)
    if recipe.data.streaming:
        streamed = stream_for_run(run, settings, files, model_path, tokenizer, resume, started)
        record(metricslog.EVENT_DATA, **streamed.summary(size))
        return streamed
    job = describe_job(settings, files, tokenizer, Path(run.plan.prepared_dir))
    found = job.existing()
    reused = found is not None
    if found is None:
        gib = job.total_bytes / 2**30
        log0(
            "preparing the data: %d files, %.2f GiB in %d chunks, over %d worker(s) (every rank) into %s",
            len(files),
            gib,
            len(job.chunks),
            size,
            job.directory,
        )
        record(metricslog.EVENT_PHASE, phase="prepare data", rank=me, chunks=len(job.chunks), workers=size)
        report = _log_progress(job, size, started) if me == 0 else (lambda: None)
        work(job, tokenizer, me, size, report)
        found = collect(job, merger=me == 0, report=report)
    else:
        log0("prepared data found in %s (fingerprint %s): reusing it", job.directory, job.fingerprint)
    train, evaluation = open_splits(job, found)
    seconds = time.monotonic() - started
    prepared = PreparedData(model_path, tokenizer, train, evaluation, found, job.directory, reused, seconds)
    _warn_about(found)
    record(metricslog.EVENT_DATA, **prepared.summary(size))
    return prepared


def rows_per_step(run: RunConfig, world_size: int) -> int:
    """Training rows one optimizer step takes: the plan's global batch, in the world this run has (the global batch
    follows the world size, arguments.py, unless an elastic plan keeps it; streaming runs have no TP, so every rank
    is a data-parallel one)."""
    if recipeview.elastic_accumulation(run.plan, world_size) is not None:
        return run.plan.global_batch_size
    return run.plan.global_batch_size * world_size // run.plan.world_size


def stream_for_run(
    run: RunConfig, settings: Settings, files: list[Any], model_path: str, tokenizer: Any, resume: Any, started: float
) -> StreamedData:
    """The stream of a ``data.streaming`` run, started at the resumed step's first row (stream.py)."""
    from ..data.stream import StreamDataset, known_chunks

    step = int(getattr(resume, "step", None) or 0)
    start_row = step * rows_per_step(run, world())
    chunks = len(plan_chunks(files, settings.chunk_bytes))
    known = known_chunks(getattr(resume, "path", None), chunks)
    if step and known is None:
        log0(
            "the checkpoint holds no stream counts (%s): reading the input again up to row %d",
            filenames.STREAM_STATE_FILE,
            start_row,
            level=logging.WARNING,
        )
    dataset = StreamDataset(
        files, settings, tokenizer, token_dtype(largest_id(tokenizer)), start_row=start_row, known=known
    )
    total = sum(f.size for f in files)
    log0(
        "streaming the data: %d files, %.2f GiB in %d chunks, read by every rank%s",
        len(files),
        total / 2**30,
        chunks,
        f", from row {start_row:,} (step {step})" if step else "",
    )
    return StreamedData(model_path, tokenizer, dataset, len(files), total, start_row, time.monotonic() - started)


def _log_progress(job: Job, size: int, started: float) -> Callable[[], None]:
    last = [time.monotonic()]

    def report() -> None:
        if time.monotonic() - last[0] < LOG_EVERY_S:
            return
        last[0] = time.monotonic()
        now = snapshot(job, size, started)
        eta = f"{now['eta_s']:.0f} s" if now["eta_s"] is not None else "?"
        log0(
            "preparing: %d/%d chunks, %d records, %d tokens, %.0f records/s, %.0f tokens/s, ETA %s",
            now["chunks"],
            now["total_chunks"],
            now["records"],
            now["tokens"],
            now["records_per_s"],
            now["tokens_per_s"],
            eta,
        )

    return report


def _warn_about(found: dict[str, Any]) -> None:
    counts = found["records"]
    if counts["bad"]:
        first = found["bad_examples"][0]
        log0(
            "%d bad record(s) skipped (data.max_bad_records allows them); first: %s: %s",
            counts["bad"],
            first["where"],
            first["message"],
            level=logging.WARNING,
        )
    if counts["dropped"]:
        log0(
            "%d of %d samples dropped: their answer starts beyond max_len=%d",
            counts["dropped"],
            counts["read"] - counts["bad"],
            found["max_len"],
            level=logging.WARNING,
        )
