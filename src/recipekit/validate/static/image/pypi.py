"""What the package index says about an image's pins: a real resolution, and a pinned wheel's own files.

The resolution runs uv (``uv pip compile``, the ``uv`` package from PyPI) for the image's Python version and
platform — ``aarch64-manylinux_2_35`` for an arm64 Ubuntu 22.04 image — against the index the Dockerfile uses,
so Requires-Python, each wheel's platforms and every Requires-Dist between the pins are the index's own data,
not a guess. Results (successes and resolution failures alike, both deterministic for fixed pins) are cached on
disk under the pins, so a repeated ``validate`` costs nothing; network errors are never cached.

Nothing here imports a training library, and nothing raises for a network problem: callers get
:class:`Unreachable` and skip with its reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from recipekit.base.paths import cache_dir
from recipekit.validate.shared.childpython import python_argv, safe_env
from recipekit.validate.static.toolpackages import install_hint

#: Bump when the cached result's meaning changes.
_CACHE_VERSION = 1
_NETWORK_WORDS = ("dns error", "error sending request", "connect", "timed out", "failed to fetch", "tls")


class Unreachable(Exception):
    """The index (or uv) cannot be used from here; the message says why."""


@dataclass(frozen=True)
class Resolution:
    """The outcome of resolving a set of pins: the versions chosen, or why no set of versions exists."""

    ok: bool
    packages: dict[str, str]
    explanation: str
    platform: str
    index_url: str


def uv_binary() -> str | None:
    """uv from its PyPI package (the ``image`` extra), beside this Python, or on PATH."""
    try:
        import uv  # noqa: PLC0415 - optional dependency

        return str(uv.find_uv_bin())
    except (ImportError, FileNotFoundError):
        beside = Path(sys.executable).parent / "uv"
        return str(beside) if beside.is_file() else shutil.which("uv")


def uv_cache() -> Path:
    """recipekit's own cache for uv (the resolver's and the engine venv's downloads)."""
    return cache_dir("uv")


def uv_environ() -> dict[str, str]:
    """The environment recipekit runs uv in: no ``uv.toml`` or ``[tool.uv]`` of the cwd or a directory above it (a
    team tree above the cwd is untrusted: its index would serve the packages), no Python downloaded, no colour."""
    return {**safe_env(), "UV_PYTHON_DOWNLOADS": "never", "UV_NO_CONFIG": "1", "NO_COLOR": "1"}


def reachable(url: str, timeout: float = 3.0) -> str | None:
    """None when ``url``'s host accepts a connection, else why not (a file:// index is always reachable)."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return None if Path(parsed.path).exists() else f"{url} does not exist"
    host = parsed.hostname
    if not host:
        return f"{url} is not a URL"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{host}:{port} not reachable ({exc.strerror or exc})"


def platform_tag(machine: str, glibc: str) -> str:
    """uv's name for a Linux target: ``aarch64-manylinux_2_35`` (uv knows glibc 2.17 to 2.40)."""
    major, minor = (int(part) for part in glibc.split(".")[:2])
    minor = max(17, min(minor, 40)) if major == 2 else 17
    return f"{machine}-manylinux_2_{minor}"


def resolve(
    requirements: list[str],
    *,
    python: str,
    platform: str,
    index_url: str,
    extra_index_urls: tuple[str, ...] = (),
    constraints: tuple[str, ...] = (),
    overrides: tuple[str, ...] = (),
    no_deps: bool = False,
    timeout: float = 600.0,
) -> Resolution:
    """Resolve ``requirements`` for ``python`` on ``platform``; raise :class:`Unreachable` without index or uv.

    ``constraints`` limit versions without requiring them (what the base image keeps); ``overrides`` replace every
    requirement on a package (torch's public version standing in for a local ``+cpu`` build the index lacks).
    ``no_deps``: each pin is found for the Python and platform, its own requirements are not followed (an engine's
    frozen set, installed ``--no-deps``).
    """
    uv = uv_binary()
    if uv is None:
        raise Unreachable(f"uv is not installed ({install_hint('image.resolve')})")
    flags = ["no-deps"] * no_deps
    key = _key(requirements, python, platform, index_url, extra_index_urls, constraints, overrides, *flags)
    cached = _cache_path(key)
    try:
        data = json.loads(cached.read_text(encoding="utf-8"))
        return Resolution(**data)
    except (OSError, ValueError, TypeError):
        pass
    why = reachable(index_url)
    if why is not None:
        raise Unreachable(f"the package index is not reachable: {why}")
    with tempfile.TemporaryDirectory(prefix="recipekit-resolve-") as tmp:
        files = {"requirements.in": requirements, "constraints.txt": constraints, "overrides.txt": overrides}
        for name, lines in files.items():
            Path(tmp, name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        command = [
            uv, "pip", "compile", "requirements.in", "--constraint", "constraints.txt", "--override", "overrides.txt",
            "--python-version", python, "--python-platform", platform, "--python", sys.executable,
            "--index-url", index_url, "--no-header", "--no-annotate", "--quiet",
            "--cache-dir", str(uv_cache()),
        ]  # fmt: skip
        for extra in extra_index_urls:
            command += ["--extra-index-url", extra]
        command += ["--no-deps"] * no_deps
        env = uv_environ()
        try:
            proc = subprocess.run(command, cwd=tmp, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise Unreachable(f"uv did not finish resolving within {timeout:.0f} s") from None
    if proc.returncode != 0:
        explanation = explain(proc.stderr)
        if any(word in proc.stderr.lower() for word in _NETWORK_WORDS) and "no solution found" not in proc.stderr:
            raise Unreachable(f"uv could not read the index: {explanation}")
        result = Resolution(False, {}, explanation, platform, index_url)
    else:
        packages = dict(re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", proc.stdout, re.MULTILINE))
        result = Resolution(True, packages, "", platform, index_url)
    _store(cached, result)
    return result


def explain(stderr: str) -> str:
    """uv's reasoning in one paragraph: the ``Because ...`` chain, without its prefixes and warnings."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("warning")]
    text = " ".join(line.removeprefix("╰─▶").removeprefix("×").removeprefix("cause:").strip() for line in lines)
    text = re.sub(r"\s+", " ", text.replace("error: ", "")).split(" hint: ")[0]  # uv's hints speak of its flags
    return text.removeprefix("No solution found when resolving dependencies ").strip() or "uv failed without a message"


def wheel_file(name: str, version: str, member: str, *, index_url: str) -> str:
    """The text of ``member`` inside the ``name==version`` wheel: the installed copy when this environment has that
    very version, else the wheel from the index (downloaded once into the cache). Raises :class:`Unreachable`."""
    from importlib import metadata

    try:
        dist = metadata.distribution(name)
        if dist.version == version:
            return Path(str(dist.locate_file(member))).read_text(encoding="utf-8")
    except (metadata.PackageNotFoundError, OSError):
        pass
    folder = cache_dir("wheels", f"{name}-{version}")
    wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if not wheels:
        why = reachable(index_url)
        if why is not None:
            raise Unreachable(f"the package index is not reachable: {why}")
        folder.mkdir(parents=True, exist_ok=True)
        command = [
            *python_argv("-m", "pip"), "download", "--quiet", "--no-deps", "--only-binary", ":all:",
            "--index-url", index_url, "--dest", str(folder), f"{name}=={version}",
        ]  # fmt: skip
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=safe_env())
        wheels = sorted(folder.glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise Unreachable(f"could not download {name}=={version}: {explain(proc.stderr)[:200]}")
    with zipfile.ZipFile(wheels[0]) as archive:
        return archive.read(member).decode("utf-8")


def _key(*parts: object) -> str:
    canonical = json.dumps([_CACHE_VERSION, *[list(p) if isinstance(p, tuple) else p for p in parts]], sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]


def _cache_path(key: str) -> Path:
    return cache_dir("resolve", f"{key}.json")


def _store(path: Path, result: Resolution) -> None:
    """Write atomically; a cache that cannot be written is no error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result.__dict__, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
