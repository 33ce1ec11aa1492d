"""Prepared data: shards independent of the worker count, the in-process path's rows and batches, fingerprints,
formats, bad-record limits, reuse and resumption of an interrupted prepare.

The runtime's modules run in-process here (``recipekit.runtime.*``; a bundle runs the same files as ``runtime.*``).
Workers are real child processes where the worker count is the point (dataprep's local pool, as ``recipekit data
prepare`` uses it), and in-process calls of the same ``work`` function elsewhere.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import os
import pickle
import time
from pathlib import Path

import pytest

from recipekit.validate.dryrun.workdir.tinydata import tiny_records, write_tiny_dataset

torch = pytest.importorskip("torch")
datasets = pytest.importorskip("datasets")

from recipekit.runtime import dataprep  # noqa: E402
from recipekit.runtime.data import samples, workers  # noqa: E402
from recipekit.runtime.data.records import DataError  # noqa: E402
from recipekit.runtime.data.sampler import ResumableSampler  # noqa: E402
from recipekit.runtime.data.shards import ShardDataset  # noqa: E402
from recipekit.runtime.data.sources import find_files  # noqa: E402
from recipekit.runtime.model import twin  # noqa: E402
from recipekit.runtime.session import rundata  # noqa: E402
from recipekit.runtime.volume import manifest, trust, verify  # noqa: E402
from tests.unit.conftest import MAX_LEN, prepare_settings, with_bad_lines  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(data_tokenizer):
    return data_tokenizer


settings = prepare_settings


def job_for(data: Path, tokenizer, root: Path, **changes) -> workers.Job:
    chosen = settings(**changes)
    return rundata.describe_job(chosen, find_files(str(data), chosen.format), tokenizer, root)


def prepare(data: Path, tokenizer, root: Path, count: int = 1, **changes) -> tuple[workers.Job, dict]:
    """Every worker's share in turn in this process, then the merge (the order of shares cannot matter)."""
    job = job_for(data, tokenizer, root, **changes)
    for rank in reversed(range(count)):
        workers.work(job, tokenizer, rank, count)
    return job, workers.collect(job, merger=True)


def tree(directory: Path) -> dict[str, bytes]:
    """The prepared dataset's bytes: every shard and the manifest (records and progress are bookkeeping)."""
    files = {p.relative_to(directory).as_posix(): p.read_bytes() for p in (directory / manifest.SHARDS).iterdir()}
    files[manifest.MANIFEST] = (directory / manifest.MANIFEST).read_bytes()
    return files


# ------------------------------------------------------------------------------------------ worker independence
@pytest.mark.parametrize(
    "fmt, name, packing",
    [("alpaca", "data.jsonl", False), ("messages", "chat.jsonl", True), ("text", "corpus", False)],
    ids=["alpaca", "chat-packed", "text-directory"],
)
def test_shards_are_byte_identical_for_one_two_and_three_worker_processes(tmp_path, tokenizer, fmt, name, packing):
    data = write_tiny_dataset(fmt, tmp_path / name, n=300, seed=1)
    trees = {}
    for count in (1, 2, 3):
        job = job_for(data, tokenizer, tmp_path / f"prepared-{count}", format=fmt, packing=packing, eval_fraction=0.1)
        events: list[dict] = []
        dataprep._with_local_workers(job, tokenizer, count, time.monotonic(), events.append)
        trees[count] = tree(job.directory)
        assert events[-1]["chunks"] == len(job.chunks) and events[-1]["records"] == 300
        if count == 3:
            assert {p.name for p in (job.directory / manifest.PROGRESS).iterdir()} == {"0.json", "1.json", "2.json"}
    assert trees[1] == trees[2] == trees[3]
    document = json.loads(trees[1][manifest.MANIFEST])
    assert document["chunks"] == len(job.chunks) > 3  # several chunks: every worker had a share
    assert document["splits"]["eval"]["rows"] > 0 and document["splits"]["train"]["rows"] > 0


def test_an_interrupted_prepare_keeps_its_finished_chunks(tmp_path, tokenizer):
    data = write_tiny_dataset("alpaca", tmp_path / "data.jsonl", n=300)
    job = job_for(data, tokenizer, tmp_path / "prepared")
    workers.work(job, tokenizer, 1, 3)  # one worker of three finished its share, then the pods died
    done = sorted(p.name for p in (job.directory / manifest.CHUNKS).iterdir())
    stamps = {name: (job.directory / manifest.CHUNKS / name).stat().st_mtime_ns for name in done}
    broken = job.directory / manifest.SHARDS / "train-000001.bin"
    broken.unlink()  # and one of its shards is gone: that chunk is prepared again
    workers.work(job, tokenizer, 0, 1)  # the restart runs with another world size
    found = workers.collect(job, merger=True)
    again = {name: (job.directory / manifest.CHUNKS / name).stat().st_mtime_ns for name in done}
    assert {n for n in done if again[n] != stamps[n]} == {"000001.json"}
    _, fresh = prepare(data, tokenizer, tmp_path / "fresh")
    assert manifest.dumps(found) == manifest.dumps(fresh)


# --------------------------------------------------------------------------------------- the in-process path
def in_process_rows(path: Path, fmt: str, tokenizer, packing: bool, cache: Path):
    """The rows train.py made before prepared data: datasets.load_dataset, then datasets.map in batches of
    samples.WINDOW (tokenise and mask, then pack; or blocks for pretraining) on the main process."""
    raw = datasets.load_dataset("json", data_files=[str(path)], split="train", cache_dir=str(cache))

    def mapped(dataset, function, tag, **kwargs):
        return dataset.map(
            function,
            batched=True,
            batch_size=samples.WINDOW,
            remove_columns=dataset.column_names,
            fn_kwargs=kwargs,
            new_fingerprint=f"{tag}-{dataset._fingerprint}",
        )

    if fmt == "text":
        return mapped(raw, samples.tokenize_into_blocks, "blocks", tokenizer=tokenizer, block_len=MAX_LEN)
    rows = mapped(raw, samples.tokenize_conversations, "tok", tokenizer=tokenizer, fmt=fmt, max_len=MAX_LEN)
    return mapped(rows, samples.pack_samples, "pack", max_len=MAX_LEN) if packing else rows


@pytest.mark.parametrize("fmt, packing", [("alpaca", False), ("messages", True), ("messages", False), ("text", False)])
def test_prepared_shards_give_the_in_process_paths_batches_token_by_token(tmp_path, tokenizer, fmt, packing):
    data = write_tiny_dataset(fmt, tmp_path / "data.jsonl", n=2500, seed=2)  # windows of 1000: several
    job, found = prepare(data, tokenizer, tmp_path / "prepared", format=fmt, packing=packing, chunk_bytes=1 << 30)
    shards = ShardDataset(job.directory, found, "train")
    reference = in_process_rows(data, fmt, tokenizer, packing, tmp_path / "cache")
    assert len(shards) == len(reference) == found["splits"]["train"]["rows"]
    assert found["row_kind"] == ("blocks" if fmt == "text" else "packed" if packing else "samples")
    assert [shards[i] for i in range(len(shards))] == list(reference)
    collate = samples.SequenceCollator(tokenizer.pad_token_id)
    loaders = [
        torch.utils.data.DataLoader(d, batch_size=4, sampler=ResumableSampler(len(d), 3), collate_fn=collate)
        for d in (shards, reference)
    ]
    count = 0
    for ours, theirs in zip(*loaders, strict=True):
        assert ours.keys() == theirs.keys() and ours["labels"].shape == theirs["labels"].shape
        for key in ours:  # input_ids, labels (the mask), and attention_mask or position_ids
            assert torch.equal(ours[key], theirs[key]), key
        count += 1
    assert count == (len(shards) + 3) // 4
    if packing:
        assert "position_ids" in ours and "attention_mask" not in ours


def test_a_shard_row_holds_what_the_tokenising_functions_made(tmp_path, tokenizer):
    data = write_tiny_dataset("alpaca", tmp_path / "data.jsonl", n=40)
    job, found = prepare(data, tokenizer, tmp_path / "prepared")
    shards = ShardDataset(job.directory, found, "train")
    record = tiny_records("alpaca", 40)[0]
    expected = samples.tokenize_conversations({k: [v] for k, v in record.items()}, tokenizer, "alpaca", MAX_LEN)
    assert shards[0] == {"input_ids": expected["input_ids"][0], "labels": expected["labels"][0]}
    assert found["token_dtype"] == "uint16" and (job.directory / "shards" / "train-000000.flg").is_file()
    assert shards[-1] == shards[len(shards) - 1]
    with pytest.raises(IndexError):
        shards[len(shards)]


def test_dataloader_worker_processes_map_the_shards_themselves(tmp_path, tokenizer):
    data = write_tiny_dataset("messages", tmp_path / "chat.jsonl", n=60)
    job, found = prepare(data, tokenizer, tmp_path / "prepared", format="messages", packing=True)
    shards = ShardDataset(job.directory, found, "train")
    assert shards[0] and shards._maps  # mapped here ...
    assert pickle.loads(pickle.dumps(shards))._maps == {}  # ... but a worker maps them anew, never gets a copy
    loader = torch.utils.data.DataLoader(
        shards, batch_size=2, num_workers=2, collate_fn=samples.SequenceCollator(tokenizer.pad_token_id)
    )
    rows = [row for batch in loader for row in batch["input_ids"].tolist()]
    assert len(rows) == len(shards)


# ----------------------------------------------------------------------------------------------- fingerprints
def test_a_changed_data_file_or_tokenizer_gets_a_new_fingerprint(tmp_path, tokenizer):
    data = write_tiny_dataset("alpaca", tmp_path / "data.jsonl", n=100)
    job, _ = prepare(data, tokenizer, tmp_path / "prepared")
    assert job_for(data, tokenizer, tmp_path / "prepared").existing() is not None  # equal inputs: reused

    os.utime(data, ns=(time.time_ns(), data.stat().st_mtime_ns + 10**9))  # rewritten, same bytes: stat says new
    assert job_for(data, tokenizer, tmp_path / "prepared").fingerprint != job.fingerprint
    by_content = job_for(data, tokenizer, tmp_path / "prepared", check="content")
    os.utime(data, ns=(time.time_ns(), data.stat().st_mtime_ns + 10**9))
    assert job_for(data, tokenizer, tmp_path / "prepared", check="content").fingerprint == by_content.fingerprint

    with data.open("a") as handle:  # one more record
        handle.write(json.dumps({"instruction": "Say hi.", "output": "hi"}) + "\n")
    assert job_for(data, tokenizer, tmp_path / "prepared", check="content").fingerprint != by_content.fingerprint

    other = twin.train_tokenizer([r["output"] for r in tiny_records("alpaca", 50)], vocab_size=300, max_length=512)
    assert job_for(data, other, tmp_path / "prepared").fingerprint != job_for(data, tokenizer, tmp_path).fingerprint
    changed = {"max_len": 64, "packing": True, "eval_fraction": 0.1, "chunk_bytes": 1024}
    base = job_for(data, tokenizer, tmp_path).fingerprint
    for key, value in changed.items():
        assert job_for(data, tokenizer, tmp_path, **{key: value}).fingerprint != base, key
    assert job_for(data, tokenizer, tmp_path, max_bad_records=5, seed=99).fingerprint == base  # no effect on rows


def test_the_same_corpus_mounted_elsewhere_keeps_its_fingerprint(tmp_path, tokenizer):
    first = write_tiny_dataset("text", tmp_path / "a" / "corpus", n=60)
    second = write_tiny_dataset("text", tmp_path / "b" / "corpus", n=60)
    for one, two in zip(sorted(first.iterdir()), sorted(second.iterdir())):
        os.utime(two, ns=(one.stat().st_atime_ns, one.stat().st_mtime_ns))
    jobs = [job_for(path, tokenizer, tmp_path, format="text") for path in (first, second)]
    assert jobs[0].fingerprint == jobs[1].fingerprint


# -------------------------------------------------------------------------------------------------- formats
@pytest.mark.parametrize("layout", ["data.json", "data.parquet", "data.arrow", "parts", "glob"])
def test_json_arrays_parquet_arrow_directories_and_globs_give_the_jsonl_rows(tmp_path, tokenizer, layout):
    reference = write_tiny_dataset("alpaca", tmp_path / "ref" / "data.jsonl", n=200, seed=5)
    _, expected = prepare(reference, tokenizer, tmp_path / "p-ref", chunk_bytes=1 << 30)
    if layout == "glob":
        for index, part in enumerate(("x", "y")):  # two JSONL files in nested directories, read in name order
            records = tiny_records("alpaca", 200, seed=5)[index * 100 : (index + 1) * 100]
            path = tmp_path / "nested" / part / "data.jsonl"
            path.parent.mkdir(parents=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
        data = tmp_path / "nested" / "**" / "*.jsonl"
    else:
        data = write_tiny_dataset("alpaca", tmp_path / "in" / layout, n=200, seed=5)
    job, found = prepare(data, tokenizer, tmp_path / "p", chunk_bytes=1 << 30)
    rows = ShardDataset(job.directory, found, "train")
    want = ShardDataset(tmp_path / "p-ref" / expected["fingerprint"], expected, "train")
    if layout == "parts":  # a directory deals the records round-robin over its files: compare as sets
        assert sorted(map(str, (rows[i] for i in range(len(rows))))) == sorted(
            map(str, (want[i] for i in range(len(want))))
        )
    else:
        assert [rows[i] for i in range(len(rows))] == [want[i] for i in range(len(want))]
    assert found["records"]["read"] == 200


def test_plain_text_documents_are_blank_line_separated_and_chunked_at_blank_lines(tmp_path, tokenizer):
    corpus = write_tiny_dataset("text", tmp_path / "corpus.txt", n=300, seed=4)
    jsonl = write_tiny_dataset("text", tmp_path / "corpus.jsonl", n=300, seed=4)
    _, small = prepare(corpus, tokenizer, tmp_path / "small", format="text", chunk_bytes=2000)
    _, whole = prepare(jsonl, tokenizer, tmp_path / "whole", format="text", chunk_bytes=1 << 30)
    assert small["chunks"] > 5 and small["records"]["read"] == whole["records"]["read"] == 300
    # the same documents, only the blocks' windows end at chunk edges: every chunk drops less than one block
    assert whole["splits"]["train"]["tokens"] - small["splits"]["train"]["tokens"] < small["chunks"] * MAX_LEN


# ------------------------------------------------------------------------------------------ compressed inputs
def _compress(plain: Path, suffix: str) -> Path:
    """``plain`` compressed next to itself as ``<name><suffix>`` (gzip without a time stamp, bz2 or xz)."""
    target = plain.with_name(plain.name + suffix)
    data = plain.read_bytes()
    target.write_bytes(
        gzip.compress(data, mtime=0)
        if suffix == ".gz"
        else bz2.compress(data)
        if suffix == ".bz2"
        else lzma.compress(data)
    )
    return target


def _rows(job: workers.Job, found: dict) -> list[dict]:
    rows = ShardDataset(job.directory, found, "train")
    return [rows[i] for i in range(len(rows))]


@pytest.mark.parametrize(
    "fmt, name, suffix",
    [
        ("alpaca", "data.jsonl", ".gz"),
        ("alpaca", "data.json", ".gz"),
        ("text", "docs.txt", ".gz"),
        ("messages", "chat.jsonl", ".bz2"),
        ("alpaca", "data.json", ".xz"),
    ],
    ids=["jsonl-gz", "json-array-gz", "text-gz", "chat-bz2", "json-array-xz"],
)
def test_a_compressed_file_gives_the_plain_files_rows(tmp_path, tokenizer, fmt, name, suffix):
    plain = write_tiny_dataset(fmt, tmp_path / "plain" / name, n=300, seed=3)
    packed = {"packing": fmt == "messages"}
    compressed = _compress(plain, suffix)
    if suffix == ".gz":  # tinydata writes the same bytes, deterministically
        assert write_tiny_dataset(fmt, tmp_path / "tiny" / compressed.name, n=300, seed=3).read_bytes() == (
            compressed.read_bytes()
        )
    # one chunk for the plain file too (a compressed file is always one): then the shards are byte for byte equal
    plain_job, plain_found = prepare(plain, tokenizer, tmp_path / "p-plain", format=fmt, chunk_bytes=1 << 30, **packed)
    job, found = prepare(compressed, tokenizer, tmp_path / "p-gz", format=fmt, chunk_bytes=1 << 30, **packed)
    assert found["chunks"] == 1 and found["records"] == plain_found["records"]
    assert found["splits"] == plain_found["splits"]  # rows, tokens, learned and every shard's sha256
    assert _rows(job, found) == _rows(plain_job, plain_found)
    assert job.fingerprint != plain_job.fingerprint  # another file name: another input
    # whatever data.shard_mib says, a compressed file is one chunk
    _, small = prepare(compressed, tokenizer, tmp_path / "p-small", format=fmt, chunk_bytes=2000, **packed)
    assert small["chunks"] == 1 and small["splits"] == found["splits"]


def test_a_glob_mixes_plain_and_compressed_files_in_name_order(tmp_path, tokenizer):
    records = tiny_records("alpaca", 300, seed=5)
    reference = tmp_path / "ref.jsonl"
    reference.write_text("".join(json.dumps(r) + "\n" for r in records))
    for index, name in enumerate(("a.jsonl", "b.jsonl.gz", "c.json.xz")):
        part = records[index * 100 : (index + 1) * 100]
        path = tmp_path / "in" / f"p{index}" / name
        path.parent.mkdir(parents=True)
        plain = path.with_name("plain")
        plain.write_text(json.dumps(part) if ".json." in name else "".join(json.dumps(r) + "\n" for r in part))
        if name.endswith(".jsonl"):
            plain.rename(path)
        else:
            _compress(plain, path.suffix).rename(path)
            plain.unlink()
    (tmp_path / "in" / "p0" / "notes.tar.gz").write_bytes(gzip.compress(b"not data", mtime=0))  # not a data file
    data = tmp_path / "in" / "**" / "*"
    files = find_files(str(data), "alpaca")
    assert [(f.name, f.kind, f.compression) for f in files] == [
        ("p0/a.jsonl", "jsonl", ""),
        ("p1/b.jsonl.gz", "jsonl", ".gz"),
        ("p2/c.json.xz", "json", ".xz"),
    ]
    assert [f.name for f in find_files(str(tmp_path / "in" / "p1"), "alpaca")] == ["b.jsonl.gz"]  # a directory
    job, found = prepare(data, tokenizer, tmp_path / "p", chunk_bytes=1 << 30)
    want_job, want = prepare(reference, tokenizer, tmp_path / "p-ref", chunk_bytes=1 << 30)
    assert found["records"]["read"] == 300 and found["chunks"] == 3
    assert _rows(job, found) == _rows(want_job, want)


def test_damaged_compressed_files_are_fatal_one_line_errors_naming_the_file(tmp_path, tokenizer):
    whole = write_tiny_dataset("alpaca", tmp_path / "data.jsonl.gz", n=300)
    truncated = tmp_path / "cut" / "data.jsonl.gz"
    truncated.parent.mkdir()
    truncated.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(workers.RunError, match=r"data error: .*cut/data.jsonl.gz: cannot be decompressed as .gz"):
        prepare(truncated, tokenizer, tmp_path / "p1", max_bad_records=1000)  # whatever the limit
    flipped = bytearray(whole.read_bytes())
    flipped[len(flipped) // 2] ^= 0xFF
    corrupt = tmp_path / "bad" / "data.jsonl.gz"
    corrupt.parent.mkdir()
    corrupt.write_bytes(bytes(flipped))
    with pytest.raises(workers.RunError, match=r"bad/data.jsonl.gz: cannot be decompressed .*damaged or truncated"):
        prepare(corrupt, tokenizer, tmp_path / "p2", max_bad_records=1000)
    not_gzip = tmp_path / "fake.json.gz"
    not_gzip.write_text('[{"instruction": "a", "output": "b"}]')
    with pytest.raises(DataError, match=r"fake.json.gz: cannot be decompressed as .gz \(BadGzipFile"):
        find_files(str(not_gzip), "alpaca")  # found out while peeking at the first character
    array = write_tiny_dataset("alpaca", tmp_path / "arr" / "data.json.gz", n=300)
    array.write_bytes(array.read_bytes()[:-30])
    with pytest.raises(workers.RunError, match=r"arr/data.json.gz: cannot be decompressed"):
        prepare(array, tokenizer, tmp_path / "p3")


def test_bad_records_in_a_compressed_file_are_named_by_line(tmp_path, tokenizer):
    plain = with_bad_lines(write_tiny_dataset("alpaca", tmp_path / "data.jsonl", n=300), {123: '{"output": "x"}'})
    data = _compress(plain, ".gz")
    with pytest.raises(workers.RunError, match=r"data.jsonl.gz:123: field 'instruction': missing"):
        prepare(data, tokenizer, tmp_path / "p")
    _, found = prepare(data, tokenizer, tmp_path / "p-ok", max_bad_records=1)
    assert found["bad_examples"][0]["where"].endswith("data.jsonl.gz:123")


def test_a_compressed_files_fingerprint_follows_its_compressed_bytes(tmp_path, tokenizer):
    data = write_tiny_dataset("alpaca", tmp_path / "data.jsonl.gz", n=50)
    stat, content = (job_for(data, tokenizer, tmp_path, check=check).fingerprint for check in ("stat", "content"))
    os.utime(data, ns=(data.stat().st_atime_ns, data.stat().st_mtime_ns + 10**9))  # touched, same bytes
    assert job_for(data, tokenizer, tmp_path).fingerprint != stat
    assert job_for(data, tokenizer, tmp_path, check="content").fingerprint == content
    data.write_bytes(gzip.compress(gzip.decompress(data.read_bytes()).replace(b"red", b"rex"), mtime=0))
    assert job_for(data, tokenizer, tmp_path, check="content").fingerprint != content


def test_compressed_parquet_and_arrow_are_refused(tmp_path):
    for name in ("data.parquet.gz", "data.arrow.xz"):
        path = tmp_path / name
        path.write_bytes(gzip.compress(b"PAR1", mtime=0))
        kind = "Parquet" if "parquet" in name else "Arrow"
        with pytest.raises(DataError, match=rf"{name}: {kind} files compress inside .*decompress it"):
            find_files(str(path), "alpaca")
        with pytest.raises(DataError, match=rf"{name}: {kind} files compress inside"):
            find_files(str(tmp_path), "alpaca")  # a directory holding one is refused too, not passed over
        path.unlink()
    text = write_tiny_dataset("text", tmp_path / "t.txt.gz", n=3)
    with pytest.raises(DataError, match="plain text holds no alpaca records"):
        find_files(str(text), "alpaca")


# -------------------------------------------------------------------------------------------------- bad data
def test_bad_records_are_fatal_by_default_and_named_by_file_line_and_field(tmp_path, tokenizer):
    data = with_bad_lines(write_tiny_dataset("alpaca", tmp_path / "data.jsonl", n=300), {123: '{"output": "x"}'})
    with pytest.raises(workers.RunError, match=r"data error: .*data.jsonl:123: field 'instruction': missing") as err:
        prepare(data, tokenizer, tmp_path / "prepared", count=2)
    assert str(err.value).endswith(
        "(data.max_bad_records is 0: a bad record is fatal; raise it to skip and count them)"
    )
    job = job_for(data, tokenizer, tmp_path / "prepared")
    assert job.failure() == str(err.value)  # every other worker stops with the same line
    assert job_for(data, tokenizer, tmp_path / "prepared", max_bad_records=1).failure() is None  # not for another limit


def test_bad_records_within_the_limit_are_skipped_and_counted(tmp_path, tokenizer):
    bad = {5: "{not json", 77: '{"instruction": 1, "output": "x"}', 250: '"a string"'}
    data = with_bad_lines(write_tiny_dataset("alpaca", tmp_path / "data.jsonl", n=300), bad)
    _, found = prepare(data, tokenizer, tmp_path / "prepared", count=3, max_bad_records=3)
    assert found["records"] == {"read": 300, "bad": 3, "dropped": 0}
    assert [e["where"].rsplit(":", 1)[1] for e in found["bad_examples"]] == ["5", "77", "250"]
    assert "field 'instruction': must be a string" in found["bad_examples"][1]["message"]
    with pytest.raises(workers.RunError, match=r"data.jsonl:5: not valid JSON .*3\+? bad records.*max_bad_records=2"):
        prepare(data, tokenizer, tmp_path / "again", max_bad_records=2)


def test_broken_files_and_empty_data_are_one_line_errors(tmp_path, tokenizer):
    array = tmp_path / "array.json"
    array.write_text('[\n {"instruction": "a", "output": "b"},\n {"instruction": "a" "output": "b"}\n]\n')
    with pytest.raises(workers.RunError, match=r"array.json:3: not valid JSON .*the array cannot be read past it"):
        prepare(array, tokenizer, tmp_path / "p1", max_bad_records=100)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n  \n\n")
    with pytest.raises(DataError, match=r"blank.jsonl: holds no records"):
        prepare(blank, tokenizer, tmp_path / "p2")
    long = write_tiny_dataset("alpaca", tmp_path / "long.jsonl", n=20)
    with pytest.raises(workers.RunError, match="no sample has an answer within max_len=4 tokens"):
        prepare(long, tokenizer, tmp_path / "p3", max_len=4)
    with pytest.raises(DataError, match="plain text holds no alpaca records"):
        find_files(str(write_tiny_dataset("text", tmp_path / "t.txt", n=3)), "alpaca")


# ------------------------------------------------------------------------------------------------- the order
def test_the_sampler_is_a_deterministic_permutation_per_epoch_and_starts_anywhere():
    sampler = ResumableSampler(1000, seed=11)
    first = list(sampler)
    assert sorted(first) == list(range(1000)) and first != list(range(1000))
    assert list(ResumableSampler(1000, seed=11)) == first
    assert sampler.order(400, 410).tolist() == first[400:410]
    sampler.set_epoch(1)
    assert list(sampler) != first and sorted(sampler) == list(range(1000))
    assert list(ResumableSampler(1000, seed=12)) != first
    for size in (1, 2, 3, 17, 1025):
        assert sorted(ResumableSampler(size, 0)) == list(range(size))


# ------------------------------------------------------------------------------------------ checking the shards
def _verify(*args: str):
    from click.testing import CliRunner

    from recipekit.cli import main

    return CliRunner().invoke(main, ["data", "verify", *args])


def test_verify_passes_a_fresh_set_and_names_every_damaged_missing_or_extra_file(tmp_path, tokenizer):
    data = write_tiny_dataset("messages", tmp_path / "chat.jsonl", n=200)
    job, found = prepare(data, tokenizer, tmp_path / "prepared", count=2, format="messages", packing=True)
    directory = job.directory
    report = verify.check(directory)
    assert report["ok"] and report["files"] == 3 * found["chunks"] and not report["problems"] and not report["extra"]
    result = _verify("--prepared", str(directory))
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"ok: all {report['files']} shard files") and str(directory) in result.output

    shards = directory / manifest.SHARDS
    tokens = shards / "train-000001.bin"
    flipped = bytearray(tokens.read_bytes())
    flipped[3] ^= 0x01
    tokens.write_bytes(bytes(flipped))
    index = shards / "train-000002.idx"
    index.write_bytes(index.read_bytes()[:-8])
    (shards / "train-000000.flg").unlink()
    (shards / "train-000009.bin.tmp-host-1").write_bytes(b"left by a crash")
    result = _verify("--prepared", str(directory))
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[:4] == [
        f"missing: {shards}/train-000000.flg: listed in the manifest, not there",
        f"sha256: {tokens}: its sha256 is not the manifest's",
        f"size: {index}: {index.stat().st_size} bytes, the manifest says {index.stat().st_size + 8}",
        f"extra: {shards}/train-000009.bin.tmp-host-1: not listed in the manifest (harmless)",
    ]
    assert lines[4].startswith(f"FAILED: 3 of {report['files']} shard files") and "1 extra file(s)" in lines[4]
    as_json = json.loads(_verify("--prepared", str(directory), "--json").output)
    assert not as_json["ok"] and [p["problem"] for p in as_json["problems"]] == ["missing", "sha256", "size"]
    assert as_json["extra"] == ["shards/train-000009.bin.tmp-host-1"]


def test_verify_without_a_manifest_or_a_target_is_exit_2(tmp_path):
    result = _verify("--prepared", str(tmp_path))
    assert result.exit_code == 2 and "nothing to verify: cannot read" in result.output
    assert _verify().exit_code == 2
    assert "not a recipekit bundle" in _verify(str(tmp_path)).output
    assert _verify(str(tmp_path)).exit_code == 2


def test_shards_rewritten_with_their_hashes_fail_verify_and_are_not_reused_under_the_run_key(
    tmp_path, tokenizer, monkeypatch
):
    """The manifest lists every shard's sha256, so it must itself be sealed with the run key (docs/trust.md):
    whoever can write to the volume could otherwise rewrite a shard and its hash together."""
    key = tmp_path / "run-key"
    key.write_text("k" * 64)
    monkeypatch.setenv(trust.KEY_ENV, str(key))
    data = write_tiny_dataset("alpaca", tmp_path / "data.jsonl", n=60)
    job, found = prepare(data, tokenizer, tmp_path / "prepared")
    assert found["hmac"] and job.existing() == found  # sealed when written, reused as it is
    assert verify.check(job.directory, key=key.read_bytes())["signature"] == "verified"

    shard = job.directory / manifest.SHARDS / "train-000000.bin"
    forged = bytearray(shard.read_bytes())
    forged[0] ^= 0x01
    shard.write_bytes(bytes(forged))
    rewritten = json.loads((job.directory / manifest.MANIFEST).read_text())
    rewritten["splits"]["train"]["shards"][0]["sha256"][".bin"] = hashlib.sha256(bytes(forged)).hexdigest()
    (job.directory / manifest.MANIFEST).write_text(json.dumps(rewritten))

    result = _verify("--prepared", str(job.directory))
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[0].startswith(f"signature: {job.directory}/manifest.json: its signature does")
    with pytest.raises(workers.RunError, match="its signature does not verify.*not reused: delete"):
        job.existing()
    monkeypatch.delenv(trust.KEY_ENV)
    unkeyed = _verify("--prepared", str(job.directory))
    assert unkeyed.exit_code == 0 and "signature not checked" in unkeyed.output
