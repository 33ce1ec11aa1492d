"""The size limits on what recipekit reads, in one place, each with the variable that raises it.

Input from elsewhere (a package from another team, a bundle directory, a matrix sweep) is read under stated bounds,
checked while reading rather than after: a 179-byte archive must not claim a gigabyte of memory, a symlink to
``/dev/zero`` must not be read until the machine runs out. Every limit has a default that real bundles stay far
below and an environment variable ``RECIPEKIT_LIMIT_<NAME>`` for the rare case that needs more; the error names
both, in one line.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from recipekit.base.errors import Problem, RecipeError
from recipekit.runtime.boundary import jsonfile

#: The longest value a limit variable may have: twelve digits are more than any limit's maximum.
MAX_DIGITS = 12


@dataclass(frozen=True)
class Limit:
    """One bound: its name (the variable is ``RECIPEKIT_LIMIT_<NAME>``), default, unit and the largest value the
    variable may set (``maximum`` units: beyond it a reader would claim more memory than a machine has)."""

    name: str
    default: int
    unit: str
    scale: int = 1  # bytes per unit
    maximum: int = 1 << 20

    @property
    def variable(self) -> str:
        return f"RECIPEKIT_LIMIT_{self.name.upper()}"

    @property
    def value(self) -> int:
        """The limit in units: the variable's value, else the default. A value that is not plain ASCII digits
        from 1 to :attr:`maximum` is an error in one line, not a silent fallback to the default."""
        text = os.environ.get(self.variable)
        if text is None or text == "":
            return self.default
        if len(text) <= MAX_DIGITS and text.isascii() and text.isdigit() and 1 <= int(text) <= self.maximum:
            return int(text)
        shown = ascii(text[:40]) + ("..." if len(text) > 40 else "")
        raise RecipeError(
            [
                Problem(
                    self.variable,
                    f"{shown} is not a whole number from 1 to {self.maximum:,} ({self.unit}, ASCII digits); "
                    f"unset it for the default of {self.default} {self.unit}",
                )
            ]
        )

    @property
    def bytes(self) -> int:
        return self.value * self.scale

    def refuse(self, what: str, found: str) -> RecipeError:
        """The one-line error: what, how big, the limit, how to raise it."""
        return RecipeError(
            [Problem(what, f"{found}: over the limit of {self.value} {self.unit} (raise it with {self.variable}=N)")]
        )


MIB = 1 << 20
#: A package archive file (compressed) and every file of a bundle directory.
PACKAGE_FILE = Limit("package_mib", 256, "MiB", MIB, maximum=16 << 10)
#: One entry of a package archive, as its tar header states it (sparse entries are refused outright).
ARCHIVE_MEMBER = Limit("member_mib", 64, "MiB", MIB, maximum=16 << 10)
BUNDLE_FILE = Limit("bundle_file_mib", 64, "MiB", MIB, maximum=16 << 10)
#: ``diff``: a file larger than this is listed as changed without a line diff; shown lines are cut at this length.
DIFF_FILE = Limit("diff_file_mib", 4, "MiB", MIB, maximum=4 << 10)
DIFF_LINE = Limit("diff_line_chars", 300, "characters", maximum=1 << 20)
#: A TOML file recipekit did not write (a team's ``recipekit.toml``, a few lines): a larger one is refused unparsed.
TOML_FILE = Limit("toml_kib", 64, "KiB", 1 << 10, maximum=64 << 10)
#: ``build -m``: bundles one matrix build may write.
MATRIX_BUNDLES = Limit("matrix_bundles", 256, "bundles", maximum=100_000)


def read_regular(path: Path, limit: Limit, what: str | None = None) -> bytes:
    """The bytes of ``path``, which must be a regular file (a symlink is followed only to one) no larger than
    ``limit``; a FIFO, device or directory is refused without blocking, an oversized file before it is read."""
    where = what or str(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise RecipeError([Problem(where, f"cannot be read ({exc.strerror or exc})")]) from None
    info = os.fstat(fd)  # before fdopen, which refuses a directory with an OSError naming the descriptor
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise RecipeError([Problem(where, "is not a regular file (a device, FIFO or directory)")])
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > limit.bytes:
            raise limit.refuse(where, f"{info.st_size:,} bytes")
        data = read_at_most(handle, limit.bytes)
    if data is None:  # grew while being read
        raise limit.refuse(where, f"more than {limit.bytes:,} bytes")
    return data


def read_at_most(handle: BinaryIO, most: int) -> bytes | None:
    """Every byte of ``handle``, or None once there are more than ``most`` (jsonfile.read_at_most: a MiB at a time,
    so memory follows what the file holds, never the limit)."""
    data = jsonfile.read_at_most(handle, most)
    return None if len(data) > most else data
