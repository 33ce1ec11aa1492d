"""The row ledger (TESTING ONLY, ``ops.testing.record_rows``): which training rows each rank trained on, per step.

A resume is exact when the steps after it consume the samples an uninterrupted run would have, none twice and none
skipped, also when the run continues at another world size. Losses only suggest it; the ledger proves it, row by
row. Every training row carries its index (:class:`RowIndexed`), the collator passes the indices along as
``rows``, and the Trainer pops them off each micro-batch before the model sees it and appends one line per
micro-batch to ``rows/rank-<R>.jsonl``: step, rank, world size, rows, and the sampler's epoch, seed and size. The
dry run's judge reads the ledger of every attempt and compares it with the permutation itself (order.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..boundary import metricslog

#: Where the ledger goes, below the output directory: one file per global rank.
LEDGER_DIR = "rows"
ROWS_KEY = "rows"


class RowIndexed:
    """A map-style dataset whose rows carry their own index, under :data:`ROWS_KEY`."""

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {**self.dataset[index], ROWS_KEY: index}

    def __getattr__(self, name: str) -> Any:  # the wrapped dataset's own attributes (tokens, shards) stay visible
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


class RowLedger:
    """Appends this rank's micro-batches to its ledger file, one JSON line each.

    Under tensor parallelism every rank of a TP group trains on the group's batch, so only the first rank of each
    group (TP is innermost: ranks g·TP … g·TP+TP-1) writes: each row of a step is then in the ledger once.
    """

    def __init__(self, output_dir: Path, rank: int, world_size: int, tensor_parallel: int = 1):
        self.path = Path(output_dir) / LEDGER_DIR / f"rank-{rank}.jsonl"
        self.rank, self.world_size = rank, world_size
        self.writes = rank % max(1, tensor_parallel) == 0
        if self.writes:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, step: int, rows: list[int], sampler: Any = None) -> None:
        """One micro-batch of optimizer step ``step``; ``sampler`` (sampler.ResumableSampler) names the order the
        rows were drawn in: its epoch, seed and size."""
        if not self.writes:
            return
        line: dict[str, Any] = {"step": step, "rank": self.rank, "world_size": self.world_size, "rows": rows}
        if sampler is not None:
            line.update(epoch=sampler.epoch, seed=sampler.seed, size=sampler.size)
        metricslog.append_record(self.path, line)


def ledger_sizes(directory: Path) -> dict[str, int]:
    """Each rank file's size now: where the next attempt's lines begin (:func:`read_ledger`'s ``after``)."""
    return {path.name: path.stat().st_size for path in sorted((Path(directory) / LEDGER_DIR).glob("rank-*.jsonl"))}


def read_ledger(
    directory: Path, after: dict[str, int] | None = None, before: dict[str, int] | None = None
) -> list[dict[str, Any]]:
    """The ledger lines of every rank below ``directory`` (an output directory) between the sizes ``after`` and
    ``before`` (:func:`ledger_sizes` taken at an attempt's start and end; None: from the start, to the end)."""
    lines: list[dict[str, Any]] = []
    for path in sorted((Path(directory) / LEDGER_DIR).glob("rank-*.jsonl")):
        with path.open("rb") as handle:
            start = (after or {}).get(path.name, 0)
            handle.seek(start)
            end = before.get(path.name, 0) if before is not None else None  # a file made after ``before``: none
            data = handle.read() if end is None else handle.read(max(0, end - start))
        for text in data.decode("utf-8", "replace").splitlines():
            try:
                line = json.loads(text)
            except ValueError:  # a process killed mid-write leaves a partial last line
                continue
            if isinstance(line, dict):
                lines.append(line)
    return lines
