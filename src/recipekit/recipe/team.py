"""Team recipe repos: ``recipekit.toml`` and the recipe layers recipekit searches.

A team keeps its recipes in a checked-in repo whose root holds ``recipekit.toml``::

    name = "team-nlp-recipes"      # shown where its options come from, recorded in bundle manifests
    recipekit = ">=0.1,<0.2"       # the recipekit versions the repo was written for; others are refused
    search_path = ["recipes"]      # recipe trees, relative to this file, in order

The layers, earliest first, are recipekit's built-in recipes, the ``search_path`` of the ``recipekit.toml`` found in
the current directory or its nearest parent, each ``--recipes DIR``, then each entry of ``RECIPEKIT_RECIPES``
(``os.pathsep``-separated). A later layer overrides an earlier one (see ``compose.composition.hydra_session``): a team's
``cluster/default.yaml`` replaces the built-in one. Discovery lives here, in the CLI's reach only: the library
(``build``, ``verify``'s rebuild) composes exactly the layers it is given, whatever the current directory or the
environment say.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipekit import __version__
from recipekit.base.errors import Collector, Problem, RecipeError

CONFIG_FILE = "recipekit.toml"
ENV_VAR = "RECIPEKIT_RECIPES"
#: The keys recipekit.toml takes, with what each must be (a closed table, like every recipe section).
_KEYS = {
    "name": "the repo's name (text)",
    "recipekit": "the recipekit versions it was written for, e.g. '>=0.1,<0.2'",
    "search_path": "recipe trees relative to recipekit.toml, e.g. ['recipes']",
}
#: What a repo name may be: it names the layer in `recipekit list` and in package directories.
REPO_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class TeamConfig:
    """A parsed ``recipekit.toml``."""

    path: Path
    name: str
    recipekit: str
    search_path: tuple[Path, ...]

    @property
    def root(self) -> Path:
        return self.path.parent


@dataclass(frozen=True)
class Layer:
    """One recipe tree on the search path, and how the user put it there (for ``recipekit list``)."""

    path: Path
    label: str


def find_config(start: Path, home: Path | None = None) -> Path | None:
    """The ``recipekit.toml`` in ``start`` or its nearest parent that has one, looking no higher than the repo root
    (a directory holding ``.git``) or the home directory, where people expect a project to end: a file further up
    (``/tmp/recipekit.toml``, a shared mount's root) was not chosen by whoever runs recipekit here.

    A file owned by another user is refused (:class:`RecipeError`), as git refuses a repository it does not own
    (safe.directory): it would decide which registry the Dockerfile pulls from."""
    start = start.resolve()
    home = _home() if home is None else home.resolve()
    for directory in (start, *start.parents):
        candidate = directory / CONFIG_FILE
        if candidate.is_file():
            _check_owner(candidate)
            return candidate
        if directory == home or (directory / ".git").exists():
            return None
    return None


def _home() -> Path | None:
    try:
        return Path.home().resolve()
    except (RuntimeError, KeyError, OSError):
        return None


def _check_owner(path: Path) -> None:
    """Refuse a recipekit.toml another user owns (root's own files are fine when running as root)."""
    if not hasattr(os, "geteuid"):  # pragma: no cover - no owners to compare on Windows
        return
    owner, me = path.stat().st_uid, os.geteuid()
    if owner != me:
        raise RecipeError(
            [
                Problem(
                    str(path),
                    f"owned by uid {owner}, not by you (uid {me}): recipekit does not use another user's "
                    "recipekit.toml",
                    hint="run from inside your own team repo, or pass the recipe trees with --recipes",
                )
            ]
        )


_announced: set[Path] = set()


def announce(config: TeamConfig) -> None:
    """Say on stderr, once per process, which recipekit.toml is in force (it silently changes options otherwise)."""
    if config.path not in _announced:
        _announced.add(config.path)
        print(f"recipekit: using {config.path} (team {config.name})", file=sys.stderr)


def read_config(path: Path) -> TeamConfig:
    """Parse and check ``recipekit.toml``: every problem at once, each naming the file and the key.

    The running recipekit must be inside the declared version range: a repo written for another version may use
    keys or options this one does not have (or has changed), and finding out from a half-right bundle costs more.
    """
    from recipekit.base import tomlfile

    where = str(path)
    data = tomlfile.read(path)  # bounded in size and depth; one line naming the file when it cannot be used
    problems = Collector()
    for key in data:
        if key not in _KEYS:
            problems.add(f"{where}: {key}", "unknown key", hint="keys: " + ", ".join(_KEYS))
    for key, what in _KEYS.items():
        if key not in data and key != "search_path":
            problems.add(f"{where}: {key}", "required key is missing", hint=f"{key} = {what}")
    name = data.get("name", "")
    if "name" in data and not (isinstance(name, str) and REPO_NAME.match(name)):
        problems.add(f"{where}: name", f"must be letters, digits, '.', '_' or '-' (got {name!r})")
    spec = data.get("recipekit", "")
    if "recipekit" in data:
        problems.extend(_version_problems(where, spec))
    raw_paths = data.get("search_path", ["recipes"])
    paths: list[Path] = []
    if not (isinstance(raw_paths, list) and raw_paths and all(isinstance(p, str) and p for p in raw_paths)):
        problems.add(f"{where}: search_path", f"must be a non-empty list of directory names (got {raw_paths!r})")
    else:
        for entry in raw_paths:
            try:
                directory = (path.parent / entry).resolve()
            except (RuntimeError, OSError):  # a symlink loop (RuntimeError before Python 3.13, OSError after)
                problems.add(f"{where}: search_path", f"{entry!r} is a symlink loop (relative to {path.parent})")
                continue
            if not directory.is_dir():
                problems.add(f"{where}: search_path", f"{entry!r} is not a directory (relative to {path.parent})")
            paths.append(directory)
    problems.raise_if_any()
    return TeamConfig(path=path.resolve(), name=name, recipekit=spec, search_path=tuple(paths))


def _version_problems(where: str, spec: Any) -> list[Problem]:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    key = f"{where}: recipekit"
    try:
        allowed = SpecifierSet(spec) if isinstance(spec, str) else None
    except InvalidSpecifier:
        allowed = None
    if allowed is None:
        return [Problem(key, f"not a version range (got {spec!r})", hint=f"e.g. {version_range()!r}")]
    if not allowed.contains(__version__, prereleases=True):
        return [
            Problem(
                key,
                f"this repo is written for recipekit {spec}; this is recipekit {__version__}",
                hint=f"install a recipekit in {spec}, or update the range once the repo builds with {__version__}",
            )
        ]
    return []


def version_range(version: str = __version__) -> str:
    """The range a repo written today declares: this minor series before 1.0 (``>=0.1,<0.2``), else this major."""
    parts = [int(p) for p in re.findall(r"\d+", version)[:2]] + [0, 0]
    major, minor = parts[0], parts[1]
    if major == 0:
        return f">=0.{minor},<0.{minor + 1}"
    return f">={major}.{minor},<{major + 1}"


def search_layers(
    cli_dirs: Sequence[Path] = (), *, cwd: Path | None = None, environ: Mapping[str, str] | None = None
) -> list[Layer]:
    """The team layers in order (recipekit.toml's, then ``--recipes``, then ``RECIPEKIT_RECIPES``), checked.

    A directory named twice keeps its first place. Raises :class:`RecipeError` naming every layer that is not a
    directory and every problem of ``recipekit.toml`` (including a recipekit version outside its range).
    """
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else cwd
    layers: list[Layer] = []
    config_path = find_config(cwd)
    if config_path is not None:
        config = read_config(config_path)
        announce(config)
        for directory in config.search_path:
            suffix = "" if len(config.search_path) == 1 else f":{directory.relative_to(config.root).as_posix()}"
            layers.append(Layer(directory, f"{config.name}{suffix}"))
    problems = Collector()
    for given in cli_dirs:
        directory = Path(given)
        if not directory.is_dir():
            problems.add(f"--recipes {given}", "not a directory")
        layers.append(Layer(directory.resolve(), f"--recipes {given}"))
    for entry in filter(None, environ.get(ENV_VAR, "").split(os.pathsep)):
        directory = Path(entry)
        if not directory.is_dir():
            problems.add(f"{ENV_VAR} {entry}", "not a directory")
        layers.append(Layer(directory.resolve(), f"{ENV_VAR} {entry}"))
    problems.raise_if_any()
    unique: dict[Path, Layer] = {}
    for layer in layers:
        unique.setdefault(layer.path, layer)
    return list(unique.values())


def layer_dirs(cli_dirs: Sequence[Path] = ()) -> tuple[Path, ...]:
    """What the CLI passes the library as ``extra_dirs``: every team layer's directory, in order."""
    return tuple(layer.path for layer in search_layers(cli_dirs))
