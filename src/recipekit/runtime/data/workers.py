"""Many workers, one prepared dataset: who prepares which chunk, how they wait, who writes the manifest.

Workers talk only through files in the dataset's directory on the shared volume — never through the process
group, whose collectives give up after ``ddp_timeout``: preparing a large corpus takes as long as it takes, and
this runs before the Trainer joins the group (session.py). A worker is any process that can read the data: every
rank of every pod in the Job, or the local processes of ``recipekit data prepare``.

* Worker r of W prepares chunks r, r + W, r + 2W, … (chunks are listed in input order from the file sizes alone, so
  every worker lists the same ones). A chunk finished by an earlier, interrupted attempt — by any worker — is not
  prepared again: its record is there and its shards are whole.
* The merger (rank 0, or the command's parent process) waits for every chunk record, judges them (bad records
  past the limit, unreadable files, no usable sample) and writes the manifest, atomically; the others wait for the
  manifest. Waiting has no time limit: a worker that died takes its pod down, and Volcano restarts the Job.
* A worker that finds the data unusable writes ``failed.json`` with the reason, so every other worker stops with
  the same one-line message instead of waiting. A reason that depends on ``data.max_bad_records`` records that
  limit and is ignored by a later run with another limit; every other reason is the data's own and stands until
  the data changes (and with it the fingerprint).
* Each worker keeps its running counts in ``progress/<rank>.json``: the merger sums them into records/s, tokens/s
  and an ETA (by input bytes).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..boundary.common import RunError
from ..volume import manifest, trust
from .fingerprint import Settings
from .prepare import ChunkPreparer, assemble, usable_record, verdict
from .sources import Chunk, InputFile

#: Seconds between looks at the shared volume while waiting.
POLL_S = 1.0
#: Seconds between two writes of a worker's progress file.
PROGRESS_EVERY_S = 2.0


def run_key() -> bytes | None:
    """The run key (trust.py), or a RunError when the file it names is unusable."""
    try:
        return trust.load_key()
    except trust.Untrusted as exc:
        raise RunError(str(exc)) from None


@dataclass(frozen=True)
class Job:
    """One prepared dataset: where it goes, what it is made from, how."""

    directory: Path
    fingerprint: str
    described: dict[str, Any]
    files: list[InputFile]
    chunks: list[Chunk]
    settings: Settings
    dtype: str

    @property
    def total_bytes(self) -> int:
        return sum(chunk.end - chunk.start for chunk in self.chunks)

    def existing(self) -> dict[str, Any] | None:
        """The finished manifest of this dataset, when there is one; a RunError when it is there but not sealed
        with the run key (docs/trust.md): its shard hashes prove nothing then, and it is not reused."""
        found = manifest.read_json(self.directory / manifest.MANIFEST)
        if found is None or found.get("fingerprint") != self.fingerprint or found.get("version") != manifest.VERSION:
            return None
        key = run_key()
        problem = trust.seal_problem(found, key) if key is not None else None
        if problem:
            raise RunError(
                f"prepared data {self.directory / manifest.MANIFEST}: {problem}; not reused: delete {self.directory} "
                "and prepare again"
            )
        return found

    def failure(self) -> str | None:
        """The reason an earlier worker gave up on this data, when it holds for this run's settings."""
        found = manifest.read_json(self.directory / manifest.FAILED)
        if found is None or found.get("fingerprint") != self.fingerprint:
            return None
        limit = found.get("limit")
        if limit is not None and limit != self.settings.max_bad_records:
            return None
        return str(found.get("message") or "preparing the data failed")

    def fail(self, problem: Exception, depends_on_limit: bool) -> Exception:
        """Record why this data cannot be used (for every other worker), and return the error to raise."""
        manifest.write_json(
            self.directory / manifest.FAILED,
            {
                "fingerprint": self.fingerprint,
                "message": str(problem),
                "limit": self.settings.max_bad_records if depends_on_limit else None,
            },
        )
        return problem


class Tally:
    """One worker's running counts, kept in ``progress/<rank>.json`` (written at most every PROGRESS_EVERY_S, when
    ``report`` is called too: the merger reports progress while it prepares its own share)."""

    def __init__(self, job: Job, rank: int, report: Callable[[], None] = lambda: None):
        self.path = job.directory / manifest.PROGRESS / f"{rank}.json"
        self.counts = {"chunks": 0, "bytes": 0, "records": 0, "tokens": 0, "reused_bytes": 0}
        self.written, self.report = 0.0, report
        self.write(force=True)

    def add(self, records: int, tokens: int) -> None:
        self.counts["records"] += records
        self.counts["tokens"] += tokens
        self.write()

    def finished(self, chunk: Chunk, reused: bool) -> None:
        self.counts["chunks"] += 1
        self.counts["reused_bytes" if reused else "bytes"] += chunk.end - chunk.start
        self.write(force=True)

    def write(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.written >= PROGRESS_EVERY_S:
            manifest.write_json(self.path, self.counts)
            self.written = now
            self.report()


def work(job: Job, tokenizer: Any, rank: int, world: int, report: Callable[[], None] = lambda: None) -> None:
    """Prepare worker ``rank``'s share of ``world`` (skipping what an earlier attempt finished)."""
    preparer = ChunkPreparer(job.directory, job.files, job.settings, tokenizer, job.dtype)
    tally = Tally(job, rank, report)
    for chunk in job.chunks[rank::world]:
        reason = job.failure()
        if reason is not None:
            raise RunError(reason)
        record = usable_record(job.directory, chunk, job.settings)
        reused = record is not None
        if record is None:
            record = preparer.prepare(chunk, tally.add)
        tally.finished(chunk, reused)
        if record["status"] != "done":
            problem = verdict([record], job.settings, len(job.chunks))
            assert problem is not None
            raise job.fail(problem, depends_on_limit=record["status"] == "aborted")


def collect(
    job: Job,
    merger: bool,
    report: Callable[[], None] = lambda: None,
    alive: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Wait for the manifest (the merger: for every chunk record, then write it). ``report`` is called at every look,
    ``alive`` too: it raises when a worker this process depends on has died."""
    seen: dict[int, dict[str, Any]] = {}
    while True:
        found = job.existing()
        if found is not None:
            return found
        reason = job.failure()
        if reason is not None:
            raise RunError(reason)
        if merger:
            _gather(job, seen)
            problem = verdict(list(seen.values()), job.settings, len(job.chunks))
            if problem is not None:
                raise job.fail(problem, depends_on_limit=not any(r["status"] == "failed" for r in seen.values()))
            if len(seen) == len(job.chunks):
                try:
                    document = assemble(
                        job.described, job.fingerprint, job.files, list(seen.values()), job.settings, job.dtype
                    )
                except RunError as exc:
                    raise job.fail(exc, depends_on_limit=False) from None
                key = run_key()
                if key is not None:  # sealed: a later run reuses it only if its seal verifies (existing())
                    document = trust.seal(document, key)
                manifest.write_json(job.directory / manifest.MANIFEST, document)
                return document
        report()
        alive()
        time.sleep(POLL_S)


def _gather(job: Job, seen: dict[int, dict[str, Any]]) -> None:
    """Add the chunk records finished since the last look (records that no longer stand are looked at again)."""
    try:
        names = os.listdir(job.directory / manifest.CHUNKS)
    except OSError:
        return
    for name in names:
        if not name.endswith(".json") or not name[:-5].isdigit():
            continue
        index = int(name[:-5])
        if index in seen or index >= len(job.chunks):
            continue
        record = usable_record(job.directory, job.chunks[index], job.settings)
        if record is not None:
            seen[index] = record


def snapshot(job: Job, world: int, started: float) -> dict[str, Any]:
    """Every worker's counts summed, with rates since ``started`` and an ETA by input bytes."""
    totals = {"chunks": 0, "bytes": 0, "records": 0, "tokens": 0, "reused_bytes": 0}
    for rank in range(world):
        counts = manifest.read_json(job.directory / manifest.PROGRESS / f"{rank}.json") or {}
        for key in totals:
            totals[key] += int(counts.get(key, 0))
    elapsed = max(time.monotonic() - started, 1e-9)
    remaining = job.total_bytes - totals["bytes"] - totals["reused_bytes"]
    byte_rate = totals["bytes"] / elapsed
    return {
        **totals,
        "total_chunks": len(job.chunks),
        "total_bytes": job.total_bytes,
        "elapsed_s": round(elapsed, 2),
        "records_per_s": round(totals["records"] / elapsed, 1),
        "tokens_per_s": round(totals["tokens"] / elapsed, 1),
        "eta_s": round(remaining / byte_rate, 1) if byte_rate > 0 else None,
    }
