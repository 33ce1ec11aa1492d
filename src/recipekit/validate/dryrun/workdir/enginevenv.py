"""The Megatron engine's own Python for the dry run: a venv built once per machine from the engine's pins file.

The dev venv (and the Trainer's images) carry transformers 5; Megatron-Bridge 0.3.1, the newest that installs on
Python 3.11, needs transformers < 5. So the dry run starts the engine's pods with another interpreter: a venv in
recipekit's per-user cache, built from ``images/engines/megatron-bridge.txt`` — every package pinned (the whole
resolution, frozen), installed with ``--no-deps`` so no build resolves anew and none can pull a CUDA torch (torch
comes from the machine's local CPU wheel: ``pip install torch==2.13.0`` finds it). The same file is what an image
of the engine starts from.

pip installs torch, so its configuration finds that wheel (uv reads no pip configuration and would take PyPI's CUDA
build); uv installs the other pins, about a hundred wheels, downloading in parallel and compiling the bytecode on
every core: the whole build took 58 to 72 s from empty caches where pip alone took 166 s. Where uv is missing or
fails (a private index only pip is configured for), pip installs them as before.

One venv per pins file and Python: its directory is named by the sha256 of both, so editing the pins builds a new
one beside the old. The build runs under the cache's flock (:mod:`.locks`): a lock held by a process that died is
free, so a build killed half-way never hangs the next one; its half-built directory has no marker (written last)
and is built again from scratch. Once built, :func:`engine_python` returns at once (a marker read and a stat).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from recipekit.base.paths import IMAGES_DIR, cache_dir
from recipekit.validate.dryrun.options import DryRunUsageError
from recipekit.validate.dryrun.workdir.locks import FileLock
from recipekit.validate.shared.childpython import python_argv, safe_env
from recipekit.validate.static.image.pypi import uv_binary, uv_cache, uv_environ

#: The engine's pins, one file for the dry run and the images.
PINS_FILE = IMAGES_DIR / "engines" / "megatron-bridge.txt"
#: The torch every build must end with: the local CPU wheel (a CUDA build would mean the pins pulled one).
TORCH = "2.13.0"
#: The marker a finished build writes last: the pins' digest and what was installed.
MARKER = "recipekit-engine.json"
LOCK = "recipekit.lock"
#: How long a build may take (pip downloads ~100 wheels, triton's the largest), and how long to wait for another's.
BUILD_TIMEOUT_S = 1800.0


class EngineVenvError(DryRunUsageError):
    """The engine's venv cannot be built here (one line: what failed and its log)."""


@dataclass(frozen=True)
class EngineVenv:
    """A built venv: its interpreter, what it holds, and how long getting it took."""

    python: Path
    installed: tuple[str, ...]
    reused: bool
    seconds: float


def pinned(pins: Path = PINS_FILE) -> list[str]:
    """The ``name==version`` lines of a pins file (comments and blank lines left out); every line must pin."""
    found = []
    for number, raw in enumerate(pins.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip() or any(c in version for c in "<>=!~*,; "):
            raise EngineVenvError(f"{pins}:{number}: {line!r} is not an exact pin (name==version)")
        found.append(f"{name.strip()}=={version.strip()}")
    return found


def venv_dir(pins: Path = PINS_FILE) -> Path:
    """Where the venv of ``pins`` lives: named by the pins' and the interpreter's digest."""
    digest = hashlib.sha256(pins.read_bytes() + sys.version.encode() + sys.base_prefix.encode()).hexdigest()[:12]
    return cache_dir("engines", f"{pins.stem}-{digest}")


def _built(directory: Path, pins: Path) -> tuple[str, ...] | None:
    """What a finished build of ``pins`` installed, or None (no build, another pins file, or one cut short)."""
    try:
        marker = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    python = directory / "bin" / "python"
    if not isinstance(marker, dict) or marker.get("pins") != pinned(pins) or not python.is_file():
        return None
    return tuple(str(p) for p in marker.get("installed", []))


def build_engine_venv(
    pins: Path = PINS_FILE, progress: Callable[[str], None] = lambda line: None, timeout_s: float = BUILD_TIMEOUT_S
) -> EngineVenv:
    """The engine's venv, built now when no finished build of ``pins`` is in the cache."""
    started = time.monotonic()
    directory = venv_dir(pins)
    installed = _built(directory, pins)
    if installed is not None:
        return EngineVenv(directory / "bin" / "python", installed, True, time.monotonic() - started)
    directory.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock.open(directory.parent / LOCK)
    try:
        _take(lock, started + timeout_s, progress)
        installed = _built(directory, pins)  # another process may have built it while this one waited
        reused = installed is not None
        if installed is None:
            lock.write_holder(f"building the Megatron engine's venv {directory.name}")
            installed = _build(directory, pins, progress, started + timeout_s)
    finally:
        lock.close()
    return EngineVenv(directory / "bin" / "python", installed, reused, time.monotonic() - started)


def _take(lock: FileLock, deadline: float, progress: Callable[[str], None]) -> None:
    said = False
    while not lock.try_lock():
        if time.monotonic() > deadline:
            raise EngineVenvError(f"the engine venv's lock {lock.path} was still held ({lock.holder()}) at the timeout")
        if not said:
            progress(f"waiting for another process building the engine's venv ({lock.holder() or 'PID unknown'})")
            said = True
        time.sleep(0.5)


def _build(directory: Path, pins: Path, progress: Callable[[str], None], deadline: float) -> tuple[str, ...]:
    """venv, then torch (pip), then every pin with --no-deps (uv, else pip), then the checks; the marker last."""
    shutil.rmtree(directory, ignore_errors=True)
    log = directory.with_name(directory.name + ".log")
    lines = pinned(pins)
    progress(f"building the Megatron engine's venv in {directory} ({len(lines)} pinned packages, once per machine)")
    python = directory / "bin" / "python"
    pip = python_argv("-m", "pip", "install", "--no-deps", "--no-input", python=python)
    with log.open("w", encoding="utf-8") as out:
        _step(python_argv("-m", "venv", str(directory)), out, log, deadline)
        _step([*pip, f"torch=={TORCH}"], out, log, deadline)
        uv = uv_binary()
        if uv is None or not _step(_uv_install(uv, python, pins), out, log, deadline, env=uv_environ(), may_fail=True):
            _step([*pip, "-r", str(pins)], out, log, deadline)
    installed = _check(python, log)
    (directory / MARKER).write_text(json.dumps({"pins": lines, "installed": list(installed)}, indent=1) + "\n")
    return installed


def _uv_install(uv: str, python: Path, pins: Path) -> list[str]:
    """uv's install of every pin into ``python``'s venv: the torch pip installed first satisfies its pin and stays."""
    into = ["--python", str(python), "--no-deps", "--compile-bytecode", "--cache-dir", str(uv_cache())]
    return [uv, "pip", "install", *into, "-r", str(pins)]


def _step(
    argv: list[str],
    out: TextIO,
    log: Path,
    deadline: float,
    *,
    env: dict[str, str] | None = None,
    may_fail: bool = False,
) -> bool:
    """Run one build step with its output in the log, the cwd off every Python's path (``env``: the step's own, else
    :func:`safe_env`); whether it passed (a failure raises unless ``may_fail``)."""
    out.write("$ " + " ".join(argv) + "\n")
    out.flush()
    left = max(1.0, deadline - time.monotonic())
    try:
        done = subprocess.run(
            argv, stdout=out, stderr=subprocess.STDOUT, timeout=left, check=False, env=env or safe_env()
        )
    except subprocess.TimeoutExpired:
        raise EngineVenvError(f"building the engine venv timed out (log: {log})") from None
    if done.returncode != 0 and not may_fail:
        raise EngineVenvError(f"building the engine venv failed: {argv[2:5]} exited {done.returncode} ({log})")
    return done.returncode == 0


#: What the check asserts in the new venv: the CPU torch of the pins, and the engine importable by name.
_CHECK = f"""
import json, torch
from importlib.metadata import distributions
assert torch.__version__.split("+")[0] == {TORCH!r}, torch.__version__
assert not torch.version.cuda, "a CUDA torch was installed: " + str(torch.version.cuda)
import megatron.core  # megatron.bridge itself imports Transformer Engine: the dry run redirects that
print(json.dumps(sorted(d.metadata["Name"] + "==" + d.version for d in distributions())))
"""


def _check(python: Path, log: Path) -> tuple[str, ...]:
    done = subprocess.run(
        python_argv("-c", _CHECK, python=python),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=safe_env(),
    )
    with log.open("a", encoding="utf-8") as out:
        out.write(done.stdout + done.stderr)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-2:])
        raise EngineVenvError(f"the engine venv does not hold what its pins say: {tail[:300]} ({log})")
    return tuple(json.loads(done.stdout.strip().splitlines()[-1]))


def engine_python(progress: Callable[[str], None] = lambda line: None) -> Path:
    """The interpreter the dry run starts the Megatron engine's pods with (built first when needed)."""
    return build_engine_venv(progress=progress).python
