"""An engine's software stack on one image family: what a Megatron bundle's image installs instead of the Trainer's.

The Trainer's stack is one resolution pip makes at build time from a handful of pins (matrix.yaml's
``python_stack``). An engine whose packages declare requirements no image can meet — Megatron-Bridge 0.3.1 declares
Transformer Engine, mamba-ssm and VLM libraries on every platform, and megatron-core's ``dev`` extra — is installed
the way the dry run's engine venv is: the whole resolution frozen in one pins file (``images/engines/<file>``),
installed with ``--no-deps``, then family by family the pins it changes (torch is the family's build; CUDA torch
pins its own triton; CANN keeps its protobuf), the sdists built against the installed torch (Transformer Engine's
torch extension), and the packages published only as a git repository at a pinned commit (MindSpeed).

``pip check`` still ends the build, passing over only the requirements the stack names in ``left_out`` with why,
so an undeclared break stops the build as it does for the Trainer's images.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from recipekit.base.errors import Problem, RecipeError
from recipekit.base.paths import IMAGES_DIR
from recipekit.recipe.schema import Section, spec

#: A git source: an https URL of a repository, ``@``, and a full 40-digit commit (a branch or tag can move).
GIT_SOURCE = re.compile(r"https://[A-Za-z0-9.-]+(/[A-Za-z0-9._-]+)+\.git@[0-9a-f]{40}")
#: A version as pins write it.
_VERSION = re.compile(r"[0-9][A-Za-z0-9.+!-]*")


class EngineStack(Section):
    """images/matrix.yaml ``families.<family>.engines.<engine>``: the engine's stack on that family's base."""

    requirements: str = spec(
        description="The engine's frozen pins file under images/engines/ (name==version lines), installed --no-deps.",
        pattern=r"[A-Za-z0-9._-]+\.txt",
    )
    drop: list[str] = spec(
        default_factory=list,
        description="Names of the pins file this family does not take from it (torch: the family's own build).",
    )
    packages: dict[str, str] = spec(
        default_factory=dict, description="Pins this family adds or puts in place of the file's, name -> version."
    )
    build_packages: dict[str, str] = spec(
        default_factory=dict,
        description="sdists built at image build against the installed torch (--no-build-isolation), name -> version.",
    )
    git: dict[str, str] = spec(
        default_factory=dict,
        description="Packages published only as a git repository: name -> https URL ending .git, @, a 40-digit commit.",
    )
    apt_packages: list[str] = spec(
        default_factory=list, description="System packages the stack's install needs (git for the git sources)."
    )
    left_out: dict[str, str] = spec(
        default_factory=dict,
        description="Requirements the stack's packages declare that the image does not meet, name -> why; the "
        "build's pip check passes over these and nothing else.",
    )
    not_proven: str = spec(description="What recipekit cannot prove of this stack without the family's hardware.")

    def rules(self) -> list[str | tuple[str, str]]:
        broken: list[str | tuple[str, str]] = []
        for name, source in self.git.items():
            if not GIT_SOURCE.fullmatch(source):
                broken.append(("git", f"{name}: {source!r} is not an https URL ending .git@<40-digit commit>"))
        for key, pins in (("packages", self.packages), ("build_packages", self.build_packages)):
            broken += [(key, f"{n}: {v!r} is not a version") for n, v in pins.items() if not _VERSION.fullmatch(v)]
        return broken


def normalize(name: str) -> str:
    """A distribution name as PyPI compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    """The ``name==version`` lines of a pins file (comments and blank lines left out); each line must pin exactly."""
    found: dict[str, str] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not _VERSION.fullmatch(version.strip()):
            raise RecipeError([Problem(f"images/engines/{path.name}:{number}", f"{line!r} is not name==version")])
        found[name.strip()] = version.strip()
    return found


def engine_pins(
    stack: EngineStack, kept: Mapping[str, str] | None = None, directory: Path = IMAGES_DIR / "engines"
) -> list[str]:
    """The stack's ``name==version`` requirements installed ``--no-deps``: the pins file less ``drop``, with the
    family's ``packages`` and the base's ``kept`` pins (CANN's protobuf) in place, sorted by normalized name (the
    build packages and git sources apart)."""
    pins = {normalize(n): (n, v) for n, v in read_pins(directory / stack.requirements).items()}
    for name in stack.drop:
        pins.pop(normalize(name), None)
    pins.update({normalize(n): (n, v) for n, v in stack.packages.items()})
    pins.update({normalize(n): (n, v) for n, v in (kept or {}).items()})
    return [f"{name}=={version}" for _, (name, version) in sorted(pins.items())]


def git_requirements(stack: EngineStack) -> list[str]:
    """pip's direct references for the git sources: ``name @ git+URL@commit``."""
    return [f"{name} @ git+{source}" for name, source in sorted(stack.git.items())]
