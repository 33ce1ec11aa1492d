"""The run's training data, ready before the process group forms: tokenizer, prepared shards, memory-mapped splits.

session.py calls :func:`prepare_for_run` in every rank before the Trainer's arguments join the process group. Each
rank finds the data files, the model's tokenizer (rank 0 first makes the random twin, when the recipe asks for one;
the others wait for its directory to appear) and the fingerprint of what the shards would be (fingerprint.py). When
``<prepared_dir>/<fingerprint>/manifest.json`` exists — an earlier attempt, another run with equal inputs, or
``recipekit data prepare`` ahead of time — the data is reused at once. Otherwise every rank of every pod prepares
its share of the chunks and rank 0 writes the manifest (workers.py); no collective waits meanwhile, so preparing a
large corpus can never trip ``ddp_timeout``. Either way each rank then memory-maps the splits (shards.py): start-up
reads the manifest, never the corpus.

``python -m runtime.dataprep --recipe recipe.yaml --workers N`` does the same ahead of time on any machine with the
bundle's Python stack, with N local worker processes, and reports progress (``--progress json``: one JSON object a
second on stdout, which ``recipekit data prepare`` draws as a progress bar). ``--volume DIR`` says where the
recipe's shared volume (``cluster.mount_path``) is mounted on this machine. Exit codes as train.py's: 0, 2 (data or
recipe unusable, one line), 1 (a bug, with a traceback).

``--verify`` finds the same directory (the fingerprint needs the data files and the tokenizer, so the random twin
must have been made by a prepare) and checks its shards against the manifest instead (verify.py): it writes
nothing. ``--progress json`` prints the report as one JSON object. Exit codes: 0 every shard matches, 1 one does
not (or a bug), 2 nothing to check (no manifest, a streaming bundle, unusable data).
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import contract, trust
from .common import LOG, RunError, log0, rank
from .config import RunConfig, load_run_config
from .fingerprint import Settings, fingerprint, inputs, tokenizer_digest
from .manifest import MANIFEST, ManifestError
from .recipeview import DataView, RecipeView
from .shards import ShardDataset, token_dtype
from .sources import find_files, first_records, plan_chunks
from .verify import check, lines
from .workers import Job, collect, snapshot, work

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
    from .twin import TOKENIZER_SAMPLE_LIMIT, corpus_texts, create_random_init

    destination = output_dir / contract.RANDOM_INIT_DIR
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
    from .model import load_tokenizer

    recipe, me, size = run.recipe, rank(), world()
    seed = int(run.training_arguments.get("seed", 42))
    started = time.monotonic()
    settings = settings_of(recipe.data, seed)
    files = find_files(str(recipe.data.path), recipe.data.format)
    model_path = model_source(recipe, settings, files, output_dir, seed, maker=me == 0)
    tokenizer = load_tokenizer(model_path, recipe.model.trust_remote_code)
    if recipe.data.streaming:
        streamed = stream_for_run(run, settings, files, model_path, tokenizer, resume, started)
        record(contract.EVENT_DATA, **streamed.summary(size))
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
        record(contract.EVENT_PHASE, phase="prepare data", rank=me, chunks=len(job.chunks), workers=size)
        report = _log_progress(job, size, started) if me == 0 else (lambda: None)
        work(job, tokenizer, me, size, report)
        found = collect(job, merger=me == 0, report=report)
    else:
        log0("prepared data found in %s (fingerprint %s): reusing it", job.directory, job.fingerprint)
    train, evaluation = open_splits(job, found)
    seconds = time.monotonic() - started
    prepared = PreparedData(model_path, tokenizer, train, evaluation, found, job.directory, reused, seconds)
    _warn_about(found)
    record(contract.EVENT_DATA, **prepared.summary(size))
    return prepared


def rows_per_step(run: RunConfig, world_size: int) -> int:
    """Training rows one optimizer step takes: the plan's global batch, in the world this run has (the global batch
    follows the world size, arguments.py; streaming runs have no TP, so every rank is a data-parallel one)."""
    return run.plan.global_batch_size * world_size // run.plan.world_size


def stream_for_run(
    run: RunConfig, settings: Settings, files: list[Any], model_path: str, tokenizer: Any, resume: Any, started: float
) -> StreamedData:
    """The stream of a ``data.streaming`` run, started at the resumed step's first row (stream.py)."""
    from .stream import StreamDataset, known_chunks

    step = int(getattr(resume, "step", None) or 0)
    start_row = step * rows_per_step(run, world())
    chunks = len(plan_chunks(files, settings.chunk_bytes))
    known = known_chunks(getattr(resume, "path", None), chunks)
    if step and known is None:
        log0(
            "the checkpoint holds no stream counts (%s): reading the input again up to row %d",
            contract.STREAM_STATE_FILE,
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


# ----------------------------------------------------------------------------------------------- ahead of time
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Prepare a bundle's training data into shards ahead of the run.")
    parser.add_argument("--recipe", type=Path, default=Path(contract.RECIPE_FILE), help="the bundle's recipe.yaml")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="local worker processes")
    parser.add_argument("--volume", type=Path, help="where the recipe's cluster.mount_path is mounted here")
    parser.add_argument("--progress", choices=("json", "text"), default="text", help="progress on stdout as JSON")
    parser.add_argument("--verify", action="store_true", help="check the prepared shards against their manifest")
    return parser.parse_args(argv)


def on_volume(path: str, mount: str, volume: Path | None) -> str:
    """``path`` of the pods, where it is on this machine: below ``volume`` when it lies on the shared volume."""
    mount = mount.rstrip("/")
    if volume is None or not (path == mount or path.startswith(mount + "/")):
        return path
    return str(volume / path[len(mount) :].lstrip("/"))


def locate(options: argparse.Namespace, make_twin: bool) -> tuple[Job, str, Any]:
    """The bundle's prepared dataset as this machine sees it (``--volume``), its model path and tokenizer. Without
    ``make_twin`` a random-init recipe whose twin is not made yet is a RunError (nothing can have been prepared)."""
    from .model import load_tokenizer

    run = load_run_config(options.recipe)
    recipe, mount = run.recipe, str(run.recipe.cluster.mount_path)
    if recipe.data.streaming:
        raise RunError(STREAMING_PREPARES_NOTHING)
    seed = int(run.training_arguments.get("seed", 42))
    settings = settings_of(recipe.data, seed)
    files = find_files(on_volume(str(recipe.data.path), mount, options.volume), recipe.data.format)
    output_dir = Path(on_volume(str(run.training_arguments["output_dir"]), mount, options.volume))
    twin = output_dir / contract.RANDOM_INIT_DIR
    if recipe.model.init == "random" and not make_twin and not (twin / "config.json").is_file():
        raise RunError(f"no random twin in {twin}, so nothing was prepared for it: run recipekit data prepare first")
    model_path = model_source(recipe, settings, files, output_dir, seed, maker=make_twin)
    tokenizer = load_tokenizer(model_path, recipe.model.trust_remote_code)
    job = describe_job(settings, files, tokenizer, Path(on_volume(str(run.plan.prepared_dir), mount, options.volume)))
    return job, model_path, tokenizer


def verify_ahead(options: argparse.Namespace) -> dict[str, Any]:
    """The verdict of verify.check on the bundle's prepared dataset; a RunError when it has not been prepared."""
    job, _, _ = locate(options, make_twin=False)
    if not (job.directory / MANIFEST).is_file():
        raise RunError(
            f"no prepared data for this bundle (fingerprint {job.fingerprint}): {job.directory / MANIFEST} does not "
            "exist; run recipekit data prepare"
        )
    try:
        return check(job.directory, key=trust.load_key())
    except (ManifestError, trust.Untrusted) as exc:
        raise RunError(str(exc)) from None


def prepare_ahead(options: argparse.Namespace, emit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Prepare (or find) the bundle's dataset with ``options.workers`` local processes; ``emit`` gets progress."""
    job, model_path, tokenizer = locate(options, make_twin=True)
    started = time.monotonic()
    found = job.existing()
    reused = found is not None
    if found is None:
        found = _with_local_workers(job, tokenizer, max(1, options.workers), started, emit)
    seconds = time.monotonic() - started
    train, evaluation = open_splits(job, found)
    summary = PreparedData(model_path, tokenizer, train, evaluation, found, job.directory, reused, seconds)
    manifest = str(job.directory / MANIFEST)
    return {"event": "done", **summary.summary(max(1, options.workers)), "manifest": manifest}


def _with_local_workers(
    job: Job, tokenizer: Any, workers: int, started: float, emit: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Workers 0..N-1 as child processes; this process merges, reports progress, and notices a worker's death."""
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    children = [context.Process(target=_worker, args=(job, tokenizer, r, workers), daemon=True) for r in range(workers)]
    for child in children:
        child.start()

    def report() -> None:
        emit({"event": "progress", **snapshot(job, workers, started)})

    def alive() -> None:
        for number, child in enumerate(children):
            if child.exitcode not in (None, 0):
                raise RunError(f"worker {number} stopped with exit code {child.exitcode} (its message is above)")

    try:
        found = collect(job, merger=True, report=report, alive=alive)
        report()
        return found
    finally:
        for child in children:
            child.join(timeout=0 if child.exitcode is None else None)
            if child.is_alive():
                child.terminate()
                child.join()


def _worker(job: Job, tokenizer: Any, me: int, workers: int) -> None:
    try:
        work(job, tokenizer, me, workers)
    except RunError as exc:
        if job.failure() != str(exc):  # a reason failed.json holds is the parent's to say, once
            print(f"dataprep: worker {me}: " + " ".join(str(exc).split()), file=sys.stderr, flush=True)
        sys.exit(contract.EXIT_USER_ERROR)
    except Exception:  # a bug: keep the traceback
        traceback.print_exc()
        sys.exit(contract.EXIT_FAILED)


#: Seconds between progress lines of ``--progress text`` (the JSON form goes out every second, for a progress bar).
TEXT_EVERY_S = 5.0


def _text_progress() -> Callable[[dict[str, Any]], None]:
    last = [0.0]

    def emit(event: dict[str, Any]) -> None:
        if event.get("event") != "progress" or time.monotonic() - last[0] < TEXT_EVERY_S:
            return
        last[0] = time.monotonic()
        eta = f"{event['eta_s']:.0f} s" if event.get("eta_s") is not None else "?"
        print(
            f"dataprep: {event['chunks']}/{event['total_chunks']} chunks, {event['records']} records, "
            f"{event['records_per_s']:.0f} records/s, {event['tokens_per_s']:.0f} tokens/s, ETA {eta}",
            file=sys.stderr,
            flush=True,
        )

    return emit


def verify_main(options: argparse.Namespace) -> int:
    """``--verify``: the report on stdout (JSON, or a line per problem and a verdict); 0 all match, 1 not, 2 none."""
    try:
        report = verify_ahead(options)
    except RunError as exc:
        print("dataprep: " + " ".join(str(exc).split()), file=sys.stderr)
        return contract.EXIT_USER_ERROR
    print(json.dumps(report) if options.progress == "json" else "\n".join(lines(report)), flush=True)
    return contract.EXIT_OK if report["ok"] else contract.EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    if options.verify:
        return verify_main(options)
    if options.progress == "json":

        def emit(event: dict[str, Any]) -> None:
            print(json.dumps(event), flush=True)

    else:
        emit = _text_progress()
    try:
        done = prepare_ahead(options, emit)
    except RunError as exc:
        print("dataprep: " + " ".join(str(exc).split()), file=sys.stderr)
        return contract.EXIT_USER_ERROR
    except Exception as exc:  # a bug or an environment failure
        LOG.exception("preparing the data failed")
        print(f"dataprep: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return contract.EXIT_FAILED
    if options.progress == "json":
        emit(done)
    else:
        print(json.dumps(done, indent=2))
    return contract.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
