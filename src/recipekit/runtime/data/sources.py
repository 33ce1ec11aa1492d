"""The input: data files → chunks (the unit of preparing work) → records, each with where it lies.

``data.path`` is a file, a directory (its data files; not recursive) or a glob (``corpus/**/*.jsonl``). Files are
taken in the sorted order of their path below the data root; that order, then the position inside a file, is the
order of the training data, whoever reads it. Kinds, by suffix: ``.jsonl`` (JSON lines), ``.json`` (a JSON array
of records, or JSON lines: the first character decides), ``.parquet``, ``.arrow`` (Arrow IPC file or stream, as
``datasets.save_to_disk`` writes) and, for ``text`` data, ``.txt`` (a document is a run of non-blank lines). A file
named explicitly with another suffix is read as JSON lines. ``.gz``, ``.bz2`` or ``.xz`` after a JSON lines, JSON or
text suffix (``corpus.jsonl.gz``, ``alpaca.json.gz``, ``docs.txt.gz``) is that kind, decompressed while it is read
(the standard library's gzip, bz2 and lzma). Parquet and Arrow files compress inside (per column chunk or batch),
so ``.parquet.gz`` and ``.arrow.gz`` are refused: they could only be read by decompressing the whole file first.

A file is cut into chunks of ``data.shard_mib`` of input. Chunk k of a file holds the records that *begin* in its
bytes [k·C, (k+1)·C), so listing the chunks needs only the file sizes, and reading one needs only its own bytes
(plus the rest of its last record). Any process can read any chunk, and what a chunk holds depends on the file and C
alone — never on how many processes share the work. Where a record begins, by kind:

* JSON lines: at byte 0 or after a newline;
* text: a chunk's edge moves forward to the next blank line, so documents never straddle two chunks;
* Parquet: a row group begins at its first column chunk (row groups are never split);
* Arrow: record batch j begins at the summed size of the batches before it (batches are never split);
* a JSON array is one chunk, read by one process as a stream, an element at a time (:mod:`jsonarray`: memory holds
  one element, whatever the array's size or whitespace; convert very large arrays to JSON lines to share the work);
* a compressed file is one chunk: a compressed stream cannot be entered at a byte offset, so its records are read
  from its first byte by one process, a line (or an array element) at a time, and reported by file and line as a
  plain file's are. Many moderately sized compressed files (a few hundred MiB each) let many processes
  share the work; one huge ``.gz`` is one process's.

A damaged or truncated compressed file is a DataError naming it, fatal whatever ``data.max_bad_records`` says:
nothing after the damage can be found.

pyarrow (a dependency of ``datasets``, so in every image) is imported only for Parquet and Arrow files.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import itertools
import lzma
import math
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..boundary import jsonfile
from . import jsonarray
from .records import DataError, Where, record_problem

KINDS = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".arrow": "arrow", ".txt": "text"}
#: Compressed files, by their last suffix: how to open them for reading (the suffix before says the kind).
COMPRESSIONS: dict[str, Callable[..., Any]] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
#: What a damaged or truncated compressed stream raises while it is read.
_DAMAGED = (OSError, EOFError, zlib.error, lzma.LZMAError)
#: The columns each format reads from Parquet and Arrow files (other columns are left on disk).
FIELDS = {"alpaca": ("instruction", "input", "output"), "messages": ("messages",), "text": ("text",)}
#: Files datasets.save_to_disk writes beside its .arrow files: metadata, not records.
#: The longest record line and the largest JSON array file read (MiB), unless RECIPEKIT_LIMIT_* raises them.
RECORD_MIB = 64
JSON_ARRAY_MIB = 1024
METADATA_NAMES = frozenset({"dataset_info.json", "state.json", "dataset_dict.json"})
#: Said where no data file is found: compressed ones count too.
_COMPRESSED = f" (JSON and text files may also be compressed: {', '.join(COMPRESSIONS)})"
_GLOB = re.compile(r"[*?\[]")
_COUNT_BLOCK = 16 << 20
_ROWS_PER_BATCH = 1_000


@dataclass(frozen=True)
class InputFile:
    """One data file: where it is, its name below the data root (what fingerprints and manifests record), its kind."""

    path: Path
    name: str
    kind: str
    size: int
    mtime_ns: int
    compression: str = ""  # "" or a key of COMPRESSIONS

    def open_decompressed(self) -> Any:
        """A binary handle on the decompressed bytes of a compressed file."""
        return COMPRESSIONS[self.compression](self.path, "rb")


@dataclass(frozen=True)
class Chunk:
    """Bytes [start, end) of input file ``file``: the records that begin there. ``index`` orders all chunks."""

    index: int
    file: int
    part: int
    start: int
    end: int


@dataclass
class Item:
    """One record as read, or why it could not be read (``problem``: message and field). Its location is worked out
    only when asked for: line numbers cost a count of the newlines before the chunk."""

    record: Any
    problem: tuple[str, str | None] | None
    locate: Callable[[], Where]

    def checked(self, fmt: str) -> tuple[str, str | None] | None:
        """Why this item cannot be trained on (unreadable or an invalid record), or None."""
        return self.problem or record_problem(self.record, fmt)


# ------------------------------------------------------------------------------------------------------ the files
def find_files(spec: str, fmt: str) -> list[InputFile]:
    """The files ``data.path`` stands for, in training order; a DataError when there are none or one is unusable."""
    _refuse_system_paths(spec)
    if _GLOB.search(spec):
        root = _glob_root(spec)
        paths = [p for p in _expand(spec, root) if p.is_file()]
        if not paths:
            raise DataError(spec, "the pattern matches no file")
        chosen = [p for p in paths if _is_data_file(p, fmt)]
        if not chosen:
            raise DataError(spec, f"the pattern matches no data file ({_suffixes(fmt)}){_COMPRESSED}")
    else:
        path = Path(spec)
        if not path.exists():
            raise DataError(path, "does not exist")
        if path.is_file():
            return [_input(path, path.parent, fmt, named=True)]
        root = path
        chosen = [p for p in path.iterdir() if p.is_file() and _is_data_file(p, fmt)]
        if not chosen:
            raise DataError(path, f"directory holds no {_suffixes(fmt)} files{_COMPRESSED}")
    for path in chosen:
        _refuse_escape(path, root)
    return sorted((_input(p, root, fmt) for p in chosen), key=lambda f: f.name)


def _refuse_escape(path: Path, root: Path) -> None:
    """A symlink among the data files must stay inside the data directory: one that leads elsewhere (a file of
    another team, a secret on the node) would be tokenised into shards on the shared volume."""
    if not path.is_symlink():
        return
    target, base = path.resolve(), root.resolve()
    if base not in target.parents:
        raise DataError(path, f"is a symlink to {target}, outside {base}: not followed (copy the file in instead)")


#: Kernel and device trees: never data, and reading them hangs (FIFOs, /dev/zero) or never ends (/proc/**).
SYSTEM_TREES = ("/proc", "/sys", "/dev")
#: The most paths one ``**`` pattern may match before it is refused.
MAX_GLOB_PATHS = 1_000_000


def _refuse_system_paths(spec: str) -> None:
    fixed = _glob_root(spec) if _GLOB.search(spec) else Path(spec)
    try:
        resolved = str(fixed.resolve())
    except (OSError, RuntimeError):
        raise DataError(spec, "cannot be resolved (a symlink loop?)") from None
    if any(resolved == tree or resolved.startswith(tree + "/") for tree in SYSTEM_TREES):
        raise DataError(spec, f"lies in {', '.join(SYSTEM_TREES)}: kernel and device files are not training data")


def _expand(spec: str, root: Path) -> list[Path]:
    """The paths a glob matches. ``**`` is expanded by pathlib, which does not descend into symlinked directories
    (``glob.glob`` does, and a symlink loop under ``**`` never ends); hidden names are skipped as glob skips them."""
    if "**" not in spec:
        return [Path(p) for p in glob.glob(spec)]
    relative = Path(spec).relative_to(root) if root != Path(".") else Path(spec)
    found = []
    for count, path in enumerate(root.glob(str(relative)), start=1):
        if count > MAX_GLOB_PATHS:
            raise DataError(spec, f"matches more than {MAX_GLOB_PATHS:,} paths: narrow the pattern")
        if not any(part.startswith(".") for part in path.relative_to(root).parts):
            found.append(path)
    return found


def _glob_root(spec: str) -> Path:
    parts = Path(spec).parts
    fixed = [part for part in parts[: next(i for i, p in enumerate(parts) if _GLOB.search(p))]]
    return Path(*fixed) if fixed else Path(".")


def _suffixes(fmt: str) -> str:
    return " or ".join(s for s in KINDS if s != ".txt" or fmt == "text")


def _suffix_of(path: Path) -> tuple[str, str]:
    """(the kind's suffix, the compression's suffix or ""): ``a.jsonl.gz`` → (".jsonl", ".gz")."""
    if path.suffix in COMPRESSIONS:
        return Path(path.stem).suffix, path.suffix
    return path.suffix, ""


def _is_data_file(path: Path, fmt: str) -> bool:
    if path.name.startswith(".") or path.name in METADATA_NAMES:
        return False
    suffix, _ = _suffix_of(path)
    return suffix in KINDS and (suffix != ".txt" or fmt == "text")


def _input(path: Path, root: Path, fmt: str, named: bool = False) -> InputFile:
    stat = path.stat()
    if stat.st_size == 0:
        raise DataError(path, "file is empty")
    suffix, compression = _suffix_of(path)
    kind = KINDS.get(suffix, "jsonl" if named else "")
    if compression and kind in ("parquet", "arrow"):
        raise DataError(
            path,
            f"{'Parquet' if kind == 'parquet' else 'Arrow'} files compress inside (per column chunk or batch) and "
            f"cannot be read through {compression}: decompress it, or write the file with its own compression "
            "(e.g. compression='zstd')",
        )
    if kind == "text" and fmt != "text":
        raise DataError(path, f"plain text holds no {fmt} records: use JSON lines, a JSON array, Parquet or Arrow")
    if kind == "json":
        kind = _json_kind(path, compression)
    try:
        name = path.relative_to(root).as_posix()
    except ValueError:
        name = path.name
    return InputFile(path, name, kind, stat.st_size, stat.st_mtime_ns, compression)


def _json_kind(path: Path, compression: str = "") -> str:
    """A .json file holds one array of records (``[``) or JSON lines (``{``): its first character says which (in a
    compressed file, the first character of its decompressed bytes)."""
    limit, seen = limit_bytes("json_array_mib", JSON_ARRAY_MIB), 0
    try:
        with COMPRESSIONS[compression](path, "rb") if compression else path.open("rb") as handle:
            while seen <= limit:  # a MiB at a time: a file of only whitespace is read through once, not held
                block = handle.read(1 << 20)
                stripped, seen = block.lstrip(), seen + len(block)
                if stripped or not block:
                    return "json" if stripped[:1] == b"[" else "jsonl"
        raise DataError(path, f"more than {limit >> 20} MiB of whitespace and no record (over the JSON array limit)")
    except _DAMAGED as exc:
        if not compression:
            raise
        raise _damaged(path, compression, exc) from None


def _damaged(path: Path, compression: str, exc: BaseException) -> DataError:
    """The one-line error of a compressed file that cannot be decompressed (corrupt, truncated or not compressed)."""
    return DataError(
        path,
        f"cannot be decompressed as {compression} ({type(exc).__name__}: {exc}): the file is damaged or truncated, "
        "and nothing after the damage can be read",
    )


# ----------------------------------------------------------------------------------------------------- the chunks
def plan_chunks(files: list[InputFile], chunk_bytes: int) -> list[Chunk]:
    """Every chunk of every file, in training order."""
    chunks: list[Chunk] = []
    for number, file in enumerate(files):
        whole = file.kind == "json" or file.compression
        parts = 1 if whole else max(1, math.ceil(file.size / chunk_bytes))
        for part in range(parts):
            end = file.size if part == parts - 1 else (part + 1) * chunk_bytes
            chunks.append(Chunk(len(chunks), number, part, part * chunk_bytes, end))
    return chunks


def read_chunk(file: InputFile, chunk: Chunk, fmt: str) -> Iterator[Item]:
    """The records that begin in ``chunk`` of ``file``, in file order. A broken JSON array or an unreadable Parquet or
    Arrow file raises DataError (nothing after the break can be found); a bad record is an Item with a problem."""
    if file.compression and file.kind in ("jsonl", "text"):
        return _compressed_lines(file)
    if file.kind == "jsonl":
        return _json_lines(file, chunk)
    if file.kind == "text":
        return _text(file, chunk)
    if file.kind == "json":
        return _json_array(file)
    if file.kind == "parquet":
        return _parquet(file, chunk, FIELDS[fmt])
    return _arrow(file, chunk, FIELDS[fmt])


class _Lines:
    """Line numbers inside one chunk: the newlines before the chunk are counted once, on the first request."""

    def __init__(self, path: Path, begin: int):
        self.path, self.begin, self.base = path, begin, -1

    def where(self, index: int) -> Callable[[], Where]:
        return lambda: Where(str(self.path), line=self.first() + index)

    def first(self) -> int:
        if self.base < 0:
            count, left = 0, self.begin
            with self.path.open("rb") as handle:
                while left > 0:
                    block = handle.read(min(_COUNT_BLOCK, left))
                    if not block:
                        break
                    count, left = count + block.count(b"\n"), left - len(block)
            self.base = count + 1
        return self.base


#: The most a data limit may be raised to (MiB): a line or an array read whole must fit a machine's memory.
LIMIT_MAX_MIB = 64 << 10


def limit_bytes(name: str, default_mib: int) -> int:
    """A size limit in bytes: ``RECIPEKIT_LIMIT_<NAME>`` (MiB, plain ASCII digits from 1 to :data:`LIMIT_MAX_MIB`)
    when set, else the default; any other value is a DataError naming the variable, not a silent default."""
    variable = f"RECIPEKIT_LIMIT_{name.upper()}"
    text = os.environ.get(variable, "") or str(default_mib)
    if len(text) <= 12 and text.isascii() and text.isdigit() and 1 <= int(text) <= LIMIT_MAX_MIB:
        return int(text) << 20
    why = f"{ascii(text[:40])} is not a whole number from 1 to {LIMIT_MAX_MIB} (MiB, ASCII digits)"
    raise DataError(variable, f"{why}; unset it for the default of {default_mib} MiB")


def record_limit() -> int:
    """The longest line (a JSON record, a text line) read, in bytes: one line must never take all memory."""
    return limit_bytes("record_mib", RECORD_MIB)


def _too_long(path: Any, limit: int, line: int | None = None) -> DataError:
    return DataError(
        str(path),
        f"a line longer than {limit >> 20} MiB: over the record limit (raise it with RECIPEKIT_LIMIT_RECORD_MIB=N)",
        line,
    )


def bounded_line(handle: Any, limit: int, path: Any, line: int | None = None) -> bytes:
    """``handle.readline()`` that reads at most ``limit`` bytes of one line; a DataError past that."""
    found = handle.readline(limit + 1)
    if len(found) > limit:
        raise _too_long(path, limit, line)
    return bytes(found)


def _line_start(handle: Any, offset: int, size: int) -> int:
    """The first line start at or after ``offset``."""
    if offset <= 0:
        return 0
    if offset >= size:
        return size
    handle.seek(offset - 1)
    bounded_line(handle, record_limit(), getattr(handle, "name", "input"))
    return handle.tell()


def _json_lines(file: InputFile, chunk: Chunk) -> Iterator[Item]:
    with file.path.open("rb") as handle:
        begin = _line_start(handle, chunk.start, file.size)
        end = _line_start(handle, chunk.end, file.size)
        handle.seek(begin)
        data = handle.read(end - begin)
    yield from _parse_json_lines(data.split(b"\n"), _Lines(file.path, begin).where)


def _parse_json_lines(raws: Iterable[bytes], where: Callable[[int], Callable[[], Where]]) -> Iterator[Item]:
    """Records of JSON lines (without their newlines); ``where(i)`` locates the i-th line of ``raws``."""
    limit = record_limit()
    for index, raw in enumerate(raws):
        if len(raw) > limit:
            place = where(index)()
            raise _too_long(place.path, limit, place.line)
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield Item(None, (f"not UTF-8 text (byte {exc.start + 1})", None), where(index))
            continue
        try:
            value = jsonfile.loads(text, "line")
        except jsonfile.UntrustedJSON as exc:  # not JSON, or nested too deep for anything to walk it
            yield Item(None, (exc.reason, None), where(index))
        else:
            yield Item(value, None, where(index))


def _text_edge(handle: Any, offset: int, size: int) -> int:
    """Where a text chunk's edge near ``offset`` really lies: the start of the next blank line (or the file's end)."""
    if offset <= 0:
        return 0
    position = _line_start(handle, offset, size)
    handle.seek(position)
    limit = record_limit()
    while position < size:
        line = bounded_line(handle, limit, getattr(handle, "name", "input"))
        if not line.strip():
            return position
        position += len(line)
    return size


def _text(file: InputFile, chunk: Chunk) -> Iterator[Item]:
    """Documents: runs of non-blank lines, joined by newlines (a CRLF file's carriage returns dropped)."""
    with file.path.open("rb") as handle:
        begin = _text_edge(handle, chunk.start, file.size)
        end = _text_edge(handle, chunk.end, file.size) if chunk.end < file.size else file.size
        handle.seek(begin)
        data = handle.read(end - begin)
    yield from _parse_text(data.split(b"\n"), _Lines(file.path, begin).where)


def _parse_text(raws: Iterable[bytes], where: Callable[[int], Callable[[], Where]]) -> Iterator[Item]:
    """Documents of text lines (without their newlines); ``where(i)`` locates the i-th line of ``raws``."""
    paragraph: list[bytes] = []
    first = 0
    limit = record_limit()
    for index, raw in enumerate(itertools.chain(raws, [b""])):
        if len(raw) > limit:
            place = where(index)()
            raise _too_long(place.path, limit, place.line)
        if raw.strip():
            if not paragraph:
                first = index
            paragraph.append(raw[:-1] if raw.endswith(b"\r") else raw)
            continue
        if paragraph:
            joined = b"\n".join(paragraph)
            paragraph = []
            try:
                yield Item({"text": joined.decode("utf-8")}, None, where(first))
            except UnicodeDecodeError as exc:
                line = first + joined.count(b"\n", 0, exc.start)
                yield Item(None, (f"not UTF-8 text (byte {exc.start + 1} of the document)", None), where(line))


def _compressed_lines(file: InputFile) -> Iterator[Item]:
    """A compressed JSON lines or text file, its only chunk: decompressed a line at a time, numbered as they come."""
    path = str(file.path)

    def where(index: int) -> Callable[[], Where]:
        return lambda: Where(path, line=index + 1)

    parse = _parse_json_lines if file.kind == "jsonl" else _parse_text
    yield from parse(_decompressed(file), where)


def _decompressed(file: InputFile) -> Iterator[bytes]:
    """The lines of a compressed file, without their newlines; a DataError where the stream is damaged."""
    limit = record_limit()
    try:
        with file.open_decompressed() as handle:
            for number in itertools.count(1):
                line = bounded_line(handle, limit, file.path, number)
                if not line:
                    break
                yield line[:-1] if line.endswith(b"\n") else line
    except _DAMAGED as exc:
        raise _damaged(file.path, file.compression, exc) from None


def _json_array(file: InputFile) -> Iterator[Item]:
    """The records of a JSON array file, streamed (:mod:`jsonarray`): memory holds one element, not the file."""
    path = str(file.path)
    limit = limit_bytes("json_array_mib", JSON_ARRAY_MIB)
    try:
        with file.open_decompressed() if file.compression else file.path.open("rb") as handle:
            for element in jsonarray.elements(handle, path, limit, record_limit()):
                problem = (element.problem, None) if element.problem else None
                yield Item(element.value, problem, _known(Where(path, line=element.line)))
    except _DAMAGED as exc:
        if not file.compression:
            raise
        raise _damaged(file.path, file.compression, exc) from None


def _known(where: Where) -> Callable[[], Where]:
    """The locator of a record whose place is already known."""
    return lambda: where


def _rows(table: Any, path: str, first_row: int) -> Iterator[Item]:
    """Records of an Arrow table or batch, a thousand rows converted to Python at a time."""
    row = first_row
    for batch in table.to_batches(max_chunksize=_ROWS_PER_BATCH):
        for record in batch.to_pylist():
            where = Where(path, row=row)
            yield Item(record, None, lambda where=where: where)
            row += 1


def _columns(schema: Any, fields: tuple[str, ...]) -> list[str]:
    return [name for name in fields if name in schema.names]


def _parquet(file: InputFile, chunk: Chunk, fields: tuple[str, ...]) -> Iterator[Item]:
    import pyarrow.parquet as pq

    path = str(file.path)
    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a damaged file
        raise DataError(path, f"not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    metadata, columns = parquet.metadata, _columns(parquet.schema_arrow, fields)
    row = 0
    for group in range(metadata.num_row_groups):
        meta = metadata.row_group(group)
        if chunk.start <= _group_offset(meta) < chunk.end:
            yield from _rows(parquet.read_row_group(group, columns=columns), path, row)
        row += meta.num_rows


def _group_offset(meta: Any) -> int:
    """Where a Parquet row group begins: its first page (a dictionary page, when there is one, comes first)."""
    offsets = []
    for index in range(meta.num_columns):
        column = meta.column(index)
        offsets.append(column.data_page_offset)
        if column.has_dictionary_page and column.dictionary_page_offset:
            offsets.append(column.dictionary_page_offset)
    return min(offsets) if offsets else 0


def _arrow(file: InputFile, chunk: Chunk, fields: tuple[str, ...]) -> Iterator[Item]:
    import pyarrow as pa

    path = str(file.path)
    try:
        source = pa.memory_map(path)
        try:
            reader = pa.ipc.open_file(source)
            batches: Iterator[Any] = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            source.seek(0)
            batches = iter(pa.ipc.open_stream(source))
        offset = row = 0
        for batch in batches:
            if chunk.start <= min(offset, file.size - 1) < chunk.end:
                yield from _rows(pa.Table.from_batches([batch.select(_columns(batch.schema, fields))]), path, row)
            offset, row = offset + batch.nbytes, row + batch.num_rows
    except pa.ArrowException as exc:
        raise DataError(path, f"not a readable Arrow IPC file ({type(exc).__name__}: {exc})") from None


def first_records(files: list[InputFile], chunks: list[Chunk], fmt: str, limit: int) -> Iterator[dict[str, Any]]:
    """Up to ``limit`` valid records from the start of the data (bad ones are passed over: preparing reports them)."""
    count = 0
    for chunk in chunks:
        for item in read_chunk(files[chunk.file], chunk, fmt):
            if item.checked(fmt) is None:
                yield item.record
                count += 1
                if count >= limit:
                    return
