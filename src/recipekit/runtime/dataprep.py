"""``python -m runtime.dataprep``: a bundle's training data prepared (or verified) ahead of the run.

``python -m runtime.dataprep --recipe recipe.yaml --workers N`` prepares what every rank of a run would
(session/rundata.py) on any machine with the bundle's Python stack, with N local worker processes, and reports
progress (``--progress json``: one JSON object a second on stdout, which ``recipekit data prepare`` draws as a
progress bar). ``--volume DIR`` says where the recipe's shared volume (``cluster.mount_path``) is mounted on this
machine. Exit codes as train.py's: 0, 2 (data or recipe unusable, one line), 1 (a bug, with a traceback).

``--verify`` finds the same directory (the fingerprint needs the data files and the tokenizer, so the random twin
must have been made by a prepare) and checks its shards against the manifest instead (volume/verify.py): it writes
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
from pathlib import Path
from typing import Any

from .boundary import exitcodes, filenames
from .boundary.common import LOG, RunError
from .boundary.config import load_run_config
from .data.sources import find_files
from .data.workers import Job, collect, snapshot, work
from .session.rundata import (
    STREAMING_PREPARES_NOTHING,
    PreparedData,
    describe_job,
    model_source,
    open_splits,
    settings_of,
)
from .volume import trust
from .volume.manifest import MANIFEST, ManifestError
from .volume.verify import check, lines


# ----------------------------------------------------------------------------------------------- ahead of time
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Prepare a bundle's training data into shards ahead of the run.")
    parser.add_argument("--recipe", type=Path, default=Path(filenames.RECIPE_FILE), help="the bundle's recipe.yaml")
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
    from .model.loader import load_tokenizer

    run = load_run_config(options.recipe)
    recipe, mount = run.recipe, str(run.recipe.cluster.mount_path)
    if recipe.data.streaming:
        raise RunError(STREAMING_PREPARES_NOTHING)
    seed = int(run.training_arguments.get("seed", 42))
    settings = settings_of(recipe.data, seed)
    files = find_files(on_volume(str(recipe.data.path), mount, options.volume), recipe.data.format)
    output_dir = Path(on_volume(str(run.training_arguments["output_dir"]), mount, options.volume))
    twin = output_dir / filenames.RANDOM_INIT_DIR
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
        sys.exit(exitcodes.EXIT_USER_ERROR)
    except Exception:  # a bug: keep the traceback
        traceback.print_exc()
        sys.exit(exitcodes.EXIT_FAILED)


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
        return exitcodes.EXIT_USER_ERROR
    print(json.dumps(report) if options.progress == "json" else "\n".join(lines(report)), flush=True)
    return exitcodes.EXIT_OK if report["ok"] else exitcodes.EXIT_FAILED


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
        return exitcodes.EXIT_USER_ERROR
    except Exception as exc:  # a bug or an environment failure
        LOG.exception("preparing the data failed")
        print(f"dataprep: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exitcodes.EXIT_FAILED
    if options.progress == "json":
        emit(done)
    else:
        print(json.dumps(done, indent=2))
    return exitcodes.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
