"""What ``recipekit image build`` sends the engine: the bundle's Dockerfile and the runtime it copies, checked first.

The image's tag is the digest of exactly its build context (image/stack.py): every bundle of one software stack names
the same ``<registry>/recipekit-<family>:<digest>``, the tag every other run of that stack pulls and that
``already_built`` finds in the registry. So a bundle whose Dockerfile gained a step, or whose ``runtime/`` gained a
line (a bundle handed over by another team, one edited in place), must never be built under that name. Before the
engine is contacted, the context is read and held against two things, each mismatch one line naming the file (exit 2):

* **manifest.json**: the Dockerfile and every file under ``runtime/`` hash as the build listed them; nothing else is
  there (a ``__pycache__``, a link, a FIFO would be copied into the image too);
* **the tag**: the digest of those bytes is the stack digest the bundle's ``plan.image`` claims, and the one a
  ``--tag`` of the stack's form (a 12-digit hex tag) claims.

The engine then gets a tar of exactly the bytes checked (no second read of the directory), so what is built is what
was compared.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipekit.base.errors import Problem, RecipeError
from recipekit.base.limits import BUNDLE_FILE, read_regular
from recipekit.image.dockerfile import split_image
from recipekit.image.stack import DOCKERFILE, TAG_LENGTH, context_digest
from recipekit.runtime.boundary import filenames

RUNTIME = filenames.RUNTIME_PACKAGE
#: The most files and the deepest nesting read under runtime/ (the package has about 80 files, 2 levels deep).
MAX_RUNTIME_FILES = 1024
MAX_RUNTIME_DEPTH = 4
#: A tag of the stack's own form: the digest of a build context.
STACK_TAG = re.compile(rf"[0-9a-f]{{{TAG_LENGTH}}}")
_REBUILD = "rebuild the bundle with `recipekit build`; never edit a built bundle's Dockerfile or runtime/"


@dataclass(frozen=True)
class BuildContext:
    """The checked build context: the Dockerfile, the runtime's files (``runtime/<path>`` → bytes) and their
    digest, the stack tag."""

    dockerfile: bytes
    runtime: dict[str, bytes]
    stack: str

    def tar(self) -> bytes:
        """The context as the engine takes it: an uncompressed tar of these bytes and nothing else, the same bytes
        for the same context (fixed owner, modes and times)."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
            directories = sorted({str(Path(name).parent) for name in self.runtime} - {"."})
            for directory in directories:
                archive.addfile(_info(directory, tarfile.DIRTYPE, 0o755, 0))
            for name, data in sorted([(DOCKERFILE, self.dockerfile), *self.runtime.items()]):
                archive.addfile(_info(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
        return buffer.getvalue()


def _info(name: str, kind: bytes, mode: int, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def checked_context(bundle: Path, manifest: dict[str, Any], claimed: str | None, tag: str | None) -> BuildContext:
    """The bundle's build context, checked against ``manifest`` (its ``files`` hashes) and against the stack digest
    ``claimed`` (the bundle's ``plan.image``) and ``tag`` (``--tag``, when it has the stack's form); RecipeError with
    one problem naming the file otherwise."""
    found = manifest.get("files")
    listed: dict[str, Any] = found if isinstance(found, dict) else {}
    dockerfile = _listed_file(bundle, DOCKERFILE, listed)
    runtime = {name: _listed_file(bundle, name, listed) for name in _runtime_names(bundle)}
    missing = sorted(n for n in listed if n.startswith(RUNTIME + "/") and n not in runtime)
    if missing:
        raise _refused(bundle / missing[0], "is listed in manifest.json but missing: the image would lack it")
    stack = context_digest(dockerfile, runtime)
    for what, reference in (("recipe.yaml: plan.image", claimed), ("--tag", tag)):
        named = split_image(reference)[1] if reference else None
        if named is not None and (what != "--tag" or STACK_TAG.fullmatch(named)) and named != stack:
            raise RecipeError(
                [
                    Problem(
                        f"{bundle / DOCKERFILE} and {bundle / RUNTIME}/",
                        f"hash to stack {stack}, but {what} names stack {named} ({reference}): the files are not "
                        "the ones that tag was made from, and an image built from them must not take its name",
                        hint=_REBUILD,
                    )
                ]
            )
    return BuildContext(dockerfile, runtime, stack)


def _listed_file(bundle: Path, name: str, listed: dict[str, Any]) -> bytes:
    """``name``'s bytes, when it is a regular file (not a link) that hashes as manifest.json lists it."""
    path = bundle / name
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        raise _refused(path, f"cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(mode):
        raise _refused(path, "is not a regular file (a link, FIFO, device or directory): the image would copy it")
    if name not in listed:
        raise _refused(path, "is not listed in manifest.json: the bundle was not built with it, and the image "
                       "would copy it")  # fmt: skip
    data = read_regular(path, BUNDLE_FILE)
    if hashlib.sha256(data).hexdigest() != listed[name]:
        raise _refused(path, "was edited after the build: its sha256 differs from manifest.json's")
    return data


def _runtime_names(bundle: Path) -> list[str]:
    """Every entry under ``runtime/`` as ``runtime/<path>``, walked without following a link; a directory deeper
    than the package nests, or more entries than it has, is refused (files are checked by :func:`_listed_file`)."""
    found: list[str] = []
    pending = [(bundle / RUNTIME, RUNTIME, 1)]
    while pending:
        directory, prefix, depth = pending.pop()
        try:
            if not stat.S_ISDIR(os.lstat(directory).st_mode):
                raise _refused(directory, "is not a directory (a link or a file): the image would copy what it is")
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            raise _refused(directory, f"cannot be read ({exc.strerror or exc})") from None
        for entry in entries:
            name = f"{prefix}/{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                if depth >= MAX_RUNTIME_DEPTH:
                    raise _refused(Path(entry.path), "nests deeper than the runtime package does")
                pending.append((Path(entry.path), name, depth + 1))
            else:
                found.append(name)
            if len(found) + len(pending) > MAX_RUNTIME_FILES:
                raise _refused(bundle / RUNTIME, f"holds more than {MAX_RUNTIME_FILES} entries")
    return sorted(found)


def _refused(path: Path, why: str) -> RecipeError:
    return RecipeError([Problem(str(path), why, hint=_REBUILD)])
