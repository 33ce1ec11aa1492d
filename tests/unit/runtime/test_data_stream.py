"""Streamed data (``data.streaming``): the stream's rows are the prepared rows, its order is keyed and resumable
without tokenising the skipped chunks again, and bad records obey the prepare step's limit.

The runtime's modules run in-process here (``recipekit.runtime.*``), on the tiny generated data and the random
twin's tokenizer, as test_prepare.py does.
"""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import pytest

from recipekit.validate.dryrun.workdir.tinydata import tiny_records, write_tiny_dataset

torch = pytest.importorskip("torch")

from recipekit.runtime.boundary import filenames  # noqa: E402
from recipekit.runtime.boundary.common import RunError  # noqa: E402
from recipekit.runtime.data import workers  # noqa: E402
from recipekit.runtime.data.samples import SequenceCollator  # noqa: E402
from recipekit.runtime.data.shards import ShardDataset, token_dtype  # noqa: E402
from recipekit.runtime.data.sources import find_files  # noqa: E402
from recipekit.runtime.data.stream import StreamDataset, StreamStateCallback, known_chunks  # noqa: E402
from recipekit.runtime.session import rundata  # noqa: E402
from tests.unit.conftest import prepare_settings, with_bad_lines  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(data_tokenizer):
    return data_tokenizer


settings = prepare_settings


def stream_of(data: Path, tokenizer, **changes) -> StreamDataset:
    chosen = settings(data.suffix == ".txt" and "text" or changes.pop("fmt", "alpaca"), **changes)
    files = find_files(str(data), chosen.format)
    return StreamDataset(files, chosen, tokenizer, token_dtype(rundata.largest_id(tokenizer)))


def take(dataset: StreamDataset, count: int) -> list[dict]:
    return list(itertools.islice(iter(dataset), count))


# ----------------------------------------------------------------------------------- the prepared rows, streamed
@pytest.mark.parametrize(
    "fmt, packing",
    [("alpaca", False), ("messages", True), ("alpaca", True), ("text", False)],
    ids=["sft", "chat-packed", "sft-packed", "text"],
)
def test_each_chunk_streams_exactly_the_rows_the_prepare_step_writes_for_it(tmp_path, tokenizer, fmt, packing):
    data = write_tiny_dataset(fmt, tmp_path / ("corpus.txt" if fmt == "text" else "data.jsonl"), n=400)
    chosen = settings(fmt, packing=packing)
    job = rundata.describe_job(chosen, find_files(str(data), fmt), tokenizer, tmp_path / "prepared")
    workers.work(job, tokenizer, 0, 1)
    found = workers.collect(job, merger=True)
    assert found["chunks"] > 3
    stream = StreamDataset(job.files, chosen, tokenizer, job.dtype)
    shards = found["splits"]["train"]["shards"]
    by_chunk = {int(entry["name"].rsplit("-", 1)[1]): entry for entry in shards}
    order = stream.chunk_order(0)
    rows = iter(stream)
    for index in order:
        expected = by_chunk.get(index)
        count = int(expected["rows"]) if expected else 0
        streamed = list(itertools.islice(rows, count))
        if expected is None:
            continue
        shard = ShardDataset(job.directory, {**found, "splits": {"train": {"shards": [expected]}}}, "train")
        prepared = [shard[i] for i in range(count)]
        # the stream shuffles within a chunk: the chunk's rows in the stream's order are the shard's, permuted
        permuted = [prepared[i] for i in stream.row_order(index, count, 0).tolist()]
        assert streamed == permuted
        assert stream.known[index]["rows"] == count
    collated = SequenceCollator(tokenizer.pad_token_id)(take(stream, 4))  # the collator takes the stream's rows
    assert collated["input_ids"].shape[0] == 4


def test_compressed_files_stream_the_rows_of_their_plain_twins(tmp_path, tokenizer):
    """The stream reads chunks with the prepare step's reader, so compressed input streams unchanged: each of a few
    compressed files is one chunk, and with chunks as large the plain files stream the very same rows."""
    records = tiny_records("alpaca", 300, seed=2)
    for index in range(3):
        part = "".join(json.dumps(r) + "\n" for r in records[index::3]).encode()
        (tmp_path / "plain").mkdir(exist_ok=True)
        (tmp_path / "gz").mkdir(exist_ok=True)
        (tmp_path / "plain" / f"part-{index}.jsonl").write_bytes(part)
        (tmp_path / "gz" / f"part-{index}.jsonl.gz").write_bytes(gzip.compress(part, mtime=0))
    compressed = stream_of(tmp_path / "gz", tokenizer, chunk_bytes=4096)
    plain = stream_of(tmp_path / "plain", tokenizer, chunk_bytes=1 << 30)
    assert len(compressed.chunks) == len(plain.chunks) == 3
    assert take(compressed, 400) == take(plain, 400)  # more than an epoch
    assert compressed.known == plain.known


def test_the_order_is_fixed_by_the_seed_and_differs_per_epoch(tmp_path, tokenizer):
    data = write_tiny_dataset("alpaca", tmp_path / "data.jsonl", n=300)
    first, again = stream_of(data, tokenizer), stream_of(data, tokenizer)
    assert first.chunk_order(0) == again.chunk_order(0)
    assert sorted(first.chunk_order(0)) == list(range(len(first.chunks)))
    assert first.chunk_order(0) != first.chunk_order(1)
    rows = take(first, 700)  # the stream goes on past the end of the data, into the next epoch
    assert take(again, 700) == rows
    epoch = sum(entry["rows"] for entry in first.known.values())
    assert len(first.known) == len(first.chunks) and 2 * epoch < 700
    one, two = rows[:epoch], rows[epoch : 2 * epoch]
    key = lambda row: tuple(row["input_ids"])  # noqa: E731
    assert sorted(map(key, one)) == sorted(map(key, two))  # every row again
    assert one != two  # in another order
    assert take(stream_of(data, tokenizer, seed=8), 20) != rows[:20]


def test_resuming_at_row_k_continues_as_the_unbroken_stream_without_tokenising_the_skipped_chunks(tmp_path, tokenizer):
    data = write_tiny_dataset("alpaca", tmp_path / "data.jsonl", n=300)
    unbroken = stream_of(data, tokenizer)
    rows = take(unbroken, 700)  # past the end of the first epoch
    epoch = sum(entry["rows"] for entry in unbroken.known.values())
    for start in (0, 5, epoch - 3, epoch + 17):
        # counted: the state the first run's rank 0 wrote at its checkpoint (counts known while drawing `start` rows)
        counted = stream_of(data, tokenizer)
        take(counted, start)
        resumed = stream_of(data, tokenizer)
        resumed.start_row, resumed.known = start, dict(counted.known)
        assert take(resumed, 30) == rows[start : start + 30]
        assert resumed.tokenised <= 2  # the chunk the row falls in (and the next one), never the skipped ones
    blind = stream_of(data, tokenizer)  # no counts (an older checkpoint): still exact, by reading again
    blind.start_row = 40
    assert take(blind, 30) == rows[40:70]


def test_the_stream_state_travels_in_the_checkpoint(tmp_path, tokenizer):
    data = write_tiny_dataset("alpaca", tmp_path / "data.jsonl", n=300)
    stream = stream_of(data, tokenizer)
    take(stream, 50)
    checkpoint = tmp_path / "out" / f"{filenames.CHECKPOINT_PREFIX}3"
    checkpoint.mkdir(parents=True)

    class Args:
        output_dir = str(tmp_path / "out")

    class State:
        is_world_process_zero, global_step = True, 3

    StreamStateCallback(stream).on_save(Args(), State(), None)
    assert (checkpoint / filenames.STREAM_STATE_FILE).is_file()
    assert known_chunks(checkpoint, len(stream.chunks)) == stream.known
    assert known_chunks(checkpoint, len(stream.chunks) + 1) is None  # another input: not used
    assert known_chunks(tmp_path, len(stream.chunks)) is None


# -------------------------------------------------------------------------------------------------- bad records
def test_bad_records_count_across_the_stream_and_one_more_than_the_limit_stops_it(tmp_path, tokenizer):
    bad = {5: "{not json", 123: '{"output": "x"}', 250: '"a string"'}
    data = with_bad_lines(write_tiny_dataset("alpaca", tmp_path / "data.jsonl", n=300), bad)
    with pytest.raises(RunError, match=r"data error: .*data.jsonl:\d+: .*max_bad_records is 0"):
        take(stream_of(data, tokenizer), 10_000)
    with pytest.raises(RunError, match=r"data error: .*data.jsonl:\d+: .*3 bad records.*max_bad_records=2"):
        take(stream_of(data, tokenizer, max_bad_records=2), 10_000)
    allowed = stream_of(data, tokenizer, max_bad_records=3)
    take(allowed, 1_000)  # more than an epoch: the same chunks again count once
    assert sum(entry["bad"] for entry in allowed.known.values()) == 3
