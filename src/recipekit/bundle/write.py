"""Bundle on disk: written whole or not at all, replaced atomically, and never over a directory that is not a bundle.

The files are written into a staging directory beside the target (same file system), which is then put in place:

* **A new target** is one ``rename`` of the staging directory: the path appears complete or not at all.
* **Replacing a bundle, on Linux** (ext4, xfs, btrfs, tmpfs, ...) is one ``renameat2(RENAME_EXCHANGE)``: the kernel
  swaps the two directory entries in a single step, so every lookup of a path in the bundle — by a person,
  ``kubectl apply -f``, ``validate`` or a script polling for ``manifest.json`` — finds a complete bundle, the old one
  or the new one, never nothing. The old tree, now under the staging name, is then deleted, so a reader already
  walking the old directory (``docker build`` sending its context) may see entries vanish and should start again, as
  with any replacement that keeps no old versions. An interruption at any moment leaves the target whole: the old
  bundle before the exchange, the new one after it. (A ``SIGKILL`` can leave the hidden ``.<name>.recipekit-*``
  staging directory behind; it is never the target.)
* **Elsewhere** (another OS; a file system without the exchange, such as NFS) it is two renames: the old bundle
  aside, then the new one in. For the instant between them the path is missing; SIGINT, SIGTERM and SIGHUP are
  held back across both renames, and any failure of the second puts the old bundle back, so only a SIGKILL or a
  power loss between them can leave the old bundle under ``.<name>.recipekit-old-*/bundle``.

Nothing is flushed to disk (``fsync``): the guarantees are against interruption and concurrent readers, not power
loss, which would cost every build tens of milliseconds.

An existing directory is replaced only when it is empty or a recipekit bundle — recognised by a *validated* manifest
(:func:`manifest_problem`), never by a word in a file — unless ``--force``. What the exchange actually took out of
place is checked again before it is deleted, so a directory swapped in between the check and the exchange is swapped
back, not deleted. Even ``--force`` never replaces ``/``, the home directory or a directory holding the working
directory. Every operating-system error on the output path is one :class:`RecipeError` naming it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from recipekit.base.errors import Problem, RecipeError
from recipekit.bundle.files import EXECUTABLE, MANIFEST

_SHA256 = re.compile(r"[0-9a-f]{64}")
#: A manifest is a few KiB; anything far larger is not one (and is not read whole).
_MAX_MANIFEST_BYTES = 16 << 20
#: renameat2 flags (linux/fs.h) and the "current directory" file descriptor for relative paths.
_RENAME_NOREPLACE, _RENAME_EXCHANGE, _AT_FDCWD = 1, 2, -100
#: errno values that mean "this kernel or file system cannot exchange": use the two-rename fallback.
_NO_EXCHANGE = {errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV}
_HELD_SIGNALS = tuple(
    s for s in (signal.SIGINT, getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s
)


class _ExchangeUnsupported(Exception):
    """renameat2(RENAME_EXCHANGE) is not available here; the caller falls back to two renames."""


# ----------------------------------------------------------------------------------------------- recognising
def manifest_problem(directory: Path) -> str | None:
    """Why ``directory`` is not a recipekit bundle, or None when it is one.

    A bundle has a ``manifest.json`` that is a JSON object with a non-empty ``recipekit_version`` string and a
    non-empty ``files`` mapping of relative file names to sha256 digests (64 lower-case hex digits) — what
    :func:`~recipekit.bundle.render.manifest` writes. Any other file called manifest.json (a list, a number, another
    tool's manifest that merely mentions ``recipekit_version``) is not.
    """
    path = Path(directory) / MANIFEST
    try:
        with open(path, "rb") as handle:
            data = handle.read(_MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        return f"no {MANIFEST}"
    except OSError as exc:
        return f"{MANIFEST} cannot be read ({exc.strerror or exc})"
    if len(data) > _MAX_MANIFEST_BYTES:
        return f"{MANIFEST} is larger than any recipekit manifest"
    try:
        manifest: Any = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return f"{MANIFEST} is not UTF-8 JSON"
    if not isinstance(manifest, dict):
        return f"{MANIFEST} holds a JSON {type(manifest).__name__}, not a recipekit manifest's object"
    version, files = manifest.get("recipekit_version"), manifest.get("files")
    if not isinstance(version, str) or not version:
        return f"{MANIFEST} has no recipekit_version string"
    if not isinstance(files, dict) or not files:
        return f"{MANIFEST} has no files mapping"
    for name, digest in files.items():
        parts = PurePosixPath(name).parts
        if not parts or name.startswith("/") or ".." in parts or not isinstance(digest, str):
            return f"{MANIFEST} lists {name!r:.60}, not a relative file name"
        if not _SHA256.fullmatch(digest):
            return f"{MANIFEST} has no sha256 digest for {name!r:.60}"
    return None


def built_for(directory: Path) -> str | None:
    """The hardware (the recipe's ``hw.name``) the bundle in ``directory`` was built for; None when it is no bundle or
    its manifest does not say (a bundle from before the hardware was recorded is not refused for it)."""
    if manifest_problem(directory) is not None:
        return None
    try:
        with open(Path(directory) / MANIFEST, "rb") as handle:
            manifest: Any = json.loads(handle.read(_MAX_MANIFEST_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    recipe = manifest.get("recipe")
    hw = recipe.get("hw") if isinstance(recipe, dict) else None
    hardware = hw.get("name") if isinstance(hw, dict) else None
    return hardware if isinstance(hardware, str) and hardware else None


def recipe_changes(directory: Path, files: dict[str, bytes], *, limit: int = 6) -> list[str]:
    """What differs between the recipe of the bundle in ``directory`` and the one ``files`` were built from, one
    ``key old → new`` each, in the recipe's order (at most ``limit``, then how many more); empty when ``directory``
    holds no bundle or the same recipe. A section whose ``name`` changed (another model, another hardware) is one
    line. Keys only one side has are left out: recipes are closed records, so those come from another recipekit
    version, not from the user."""
    if manifest_problem(directory) is not None or MANIFEST not in files:
        return []
    try:
        with open(Path(directory) / MANIFEST, "rb") as handle:
            before: Any = json.loads(handle.read(_MAX_MANIFEST_BYTES).decode("utf-8")).get("recipe")
        after: Any = json.loads(files[MANIFEST].decode("utf-8")).get("recipe")
    except (OSError, ValueError, RecursionError, AttributeError):
        return []
    if not isinstance(before, dict) or not isinstance(after, dict):
        return []
    old, new = _leaves(before), _leaves(after)
    renamed = [
        key.removesuffix(".name") for key in new if key.endswith(".name") and key in old and old[key] != new[key]
    ]
    changes = []
    for key, value in new.items():
        section = next((r for r in renamed if key.startswith(r + ".")), None)
        if key not in old or old[key] == value or (section is not None and key != section + ".name"):
            continue
        shown = section or key
        changes.append(f"{shown} {_short(old[key])} → {_short(value)}")
    if len(changes) > limit:
        return changes[:limit] + [f"and {len(changes) - limit} more"]
    return changes


def _leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    """``data``'s values by dotted key; a list is one value."""
    if not isinstance(data, dict):
        return {prefix: data}
    found: dict[str, Any] = {}
    for key, value in data.items():
        found.update(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return found


def _short(value: Any, width: int = 24) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def is_bundle(directory: Path) -> bool:
    """A directory recipekit wrote: its manifest validates (:func:`manifest_problem`)."""
    return manifest_problem(directory) is None


def _replaceable(directory: Path) -> str | None:
    """Why ``directory`` must not be replaced without ``--force`` (None: it is empty or a bundle)."""
    try:
        with os.scandir(directory) as entries:
            if next(entries, None) is None:
                return None
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    problem = manifest_problem(directory)
    return None if problem is None else f"exists and is not a recipekit bundle ({problem})"


def _protected(target: Path) -> str | None:
    """Directories not even ``--force`` replaces: the root, the home directory, any directory holding the current
    working directory or the home directory (replacing it would delete them)."""
    keep = []
    for where in (Path.home, Path.cwd):
        with contextlib.suppress(OSError, RuntimeError):  # no HOME, a deleted working directory
            keep.append(Path(os.path.realpath(where())))
    if target == Path(target.anchor):
        return "is the root directory"
    if any(target == path or target in path.parents for path in keep):
        return "is or holds the home directory or the current working directory"
    return None


# ------------------------------------------------------------------------------------------------------- writing
def write_bundle(files: dict[str, bytes], target: Path, *, force: bool = False, hardware: str | None = None) -> Path:
    """Write ``files`` as the directory ``target``, atomically (see the module's docstring); return its real path.

    Raises :class:`RecipeError` — and leaves the file system as it was — when ``target`` is not a directory, is a
    directory that is neither empty nor a bundle (without ``force``), holds a bundle built for other ``hardware``
    than this one (without ``force``: a second target's build must not silently replace the first's), or the
    operating system refuses any step.
    """
    given = str(target)
    created: list[Path] = []
    installed = False
    try:
        target = Path(os.path.realpath(target))
        _check_target(target, given, force)
        _check_hardware(target, given, force, hardware)
        created = _make_parents(target.parent)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name[:100]}.recipekit-new-", dir=target.parent))
        try:
            _write_tree(staging, files)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _install(staging, target, given, force)
        installed = True
    except OSError as exc:
        raise RecipeError([_os_problem(given, exc)]) from None
    finally:
        if not installed:
            for directory in reversed(created):
                with contextlib.suppress(OSError):
                    directory.rmdir()
    return target


def _check_target(target: Path, given: str, force: bool) -> None:
    if not target.exists():
        if target.is_symlink():  # os.path.realpath leaves a link it cannot follow (a loop) as it is
            raise RecipeError([Problem(given, "is a symbolic link that cannot be resolved (a loop?)")])
        return
    if not target.is_dir():
        raise RecipeError([Problem(given, "exists and is not a directory", "choose another -o directory")])
    protected = _protected(target)
    if protected is not None:
        raise RecipeError([Problem(given, f"{protected}: recipekit never replaces it", "choose another -o")])
    reason = _replaceable(target)
    if reason is not None and not force:
        raise RecipeError([Problem(given, reason, "choose another -o directory, or pass --force to replace it")])


def _check_hardware(target: Path, given: str, force: bool, hardware: str | None) -> None:
    """Refuse to replace a bundle built for other hardware (``ascend910b`` by ``h100``) unless ``force``."""
    if force or hardware is None or not target.is_dir():
        return
    before = built_for(target)
    if before is not None and before != hardware:
        raise RecipeError(
            [
                Problem(
                    given,
                    f"holds the bundle built for {before}; this build is for {hardware}",
                    "pass --force to replace it, or --output DIR to keep both",
                )
            ]
        )


def _make_parents(parent: Path) -> list[Path]:
    """Create ``parent`` and its missing ancestors; return those created (removed again if the build fails)."""
    missing = []
    for directory in [parent, *parent.parents]:
        if directory.exists() or directory.is_symlink():
            break
        missing.append(directory)
    created = []
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            if directory.is_dir() and not directory.is_symlink():
                continue  # made meanwhile by a sibling build of the same sweep (build -m): not ours to remove
            raise
        created.append(directory)
    return created


def _write_tree(staging: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = staging / name
        if path.parent != staging:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.parent.chmod(0o755)
        with open(path, "xb") as handle:
            handle.write(data)
        path.chmod(0o755 if name in EXECUTABLE else 0o644)
    staging.chmod(0o755)


def _install(staging: Path, target: Path, given: str, force: bool) -> None:
    """Put ``staging`` in place at ``target`` (see the module's docstring for what each path guarantees).

    Owns ``staging`` from here on: whatever happens, it is deleted when it holds the new tree or the replaced
    bundle, and kept only when it holds a directory that was not recipekit's to delete.
    """
    ours_at_staging = True  # False once the exchange has put the old target under the staging name
    try:
        with _signals_held():
            if not target.exists():
                try:
                    os.rename(staging, target)  # onto nothing (or onto an empty directory made meanwhile)
                    ours_at_staging = False
                    return
                except OSError as exc:
                    if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                        raise
                _check_target(target, given, force)  # a directory appeared meanwhile: judge it like any other
            try:
                _exchange(staging, target)
            except _ExchangeUnsupported:
                _replace_in_two_renames(staging, target)
                ours_at_staging = False
                return
            ours_at_staging = False
            # ``staging`` now holds what was at the target: delete it only if it still is what was checked.
            reason = None if force else _replaceable(staging)
            if reason is None:
                shutil.rmtree(staging, ignore_errors=True)
                return
            try:
                _exchange(staging, target)
            except (OSError, _ExchangeUnsupported):
                raise RecipeError(
                    [Problem(given, f"changed while building and {reason}; it is now at {staging}", "move it back")]
                ) from None
            ours_at_staging = True
            raise RecipeError([Problem(given, f"changed while building and {reason}", "run the build again")])
    finally:
        if ours_at_staging:
            shutil.rmtree(staging, ignore_errors=True)


def _exchange(first: Path, second: Path) -> None:
    """Swap two directory entries atomically: Linux's ``renameat2(RENAME_EXCHANGE)``, through ctypes."""
    if not sys.platform.startswith("linux"):
        raise _ExchangeUnsupported
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)  # glibc 2.28+, musl 1.2.?+
    if renameat2 is None:
        raise _ExchangeUnsupported
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return
    code = ctypes.get_errno()
    if code in _NO_EXCHANGE:
        raise _ExchangeUnsupported
    raise OSError(code, os.strerror(code), str(second))


def _replace_in_two_renames(staging: Path, target: Path) -> None:
    """The fallback: old bundle aside, new one in, old one back on any failure; the old copy deleted last."""
    retired = Path(tempfile.mkdtemp(prefix=f".{target.name[:100]}.recipekit-old-", dir=target.parent))
    os.rename(target, retired / "bundle")
    try:
        os.rename(staging, target)
    except BaseException:
        os.rename(retired / "bundle", target)
        shutil.rmtree(retired, ignore_errors=True)
        raise
    shutil.rmtree(retired, ignore_errors=True)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold back SIGINT, SIGTERM and SIGHUP while the bundle is put in place, then deliver them: Ctrl-C or a
    scheduler's TERM cannot stop the process between two steps that belong together.

    Done with Python-level handlers that only record the signal, not a thread signal mask: a process-directed
    signal goes to any thread that does not block it (a library's helper thread), and Python runs its handler in the
    main thread at once whichever thread took it. Handlers can only be set from the main thread; elsewhere the
    signals are left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous: dict[int, Any] = {}
    for signum in _HELD_SIGNALS:
        handler = signal.getsignal(signum)
        if handler is None:  # installed by C code: it could not be put back
            continue
        previous[signum] = handler
        signal.signal(signum, lambda number, frame: received.append(number))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in received:
            signal.raise_signal(signum)  # now, to the handler that was there before


def _os_problem(given: str, exc: OSError) -> Problem:
    """One line for an operating-system error on the output path: which path, what the OS said, what to do."""
    where = given if exc.filename is None else os.fsdecode(exc.filename)
    if ".recipekit-" in os.path.basename(where):  # our own staging name: the directory it was made in matters
        where = os.path.dirname(where)
    reason = exc.strerror or str(exc)
    hint = {
        errno.EACCES: "a directory you can write to",
        errno.EPERM: "a directory you can write to",
        errno.EROFS: "a writable file system",
        errno.ENOTDIR: "a path whose parents are directories",
        errno.ENAMETOOLONG: "a shorter path (a name is at most 255 bytes)",
        errno.ELOOP: "a path without a symbolic-link loop",
        errno.ENOSPC: "free some space",
    }.get(exc.errno or 0, "choose another -o directory")
    shown = where.encode("utf-8", "backslashreplace").decode()
    message = f"cannot write the bundle: {reason}" + (f" ({shown})" if where not in (given, "") else "")
    return Problem(given.encode("utf-8", "backslashreplace").decode(), message, hint)
