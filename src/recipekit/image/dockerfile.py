"""Reading a bundle's Dockerfile back: what it builds from and what it installs, as data.

``validate`` checks the Dockerfile a bundle really ships (it may have been edited), and ``recipekit image build``
needs its build arguments; both read it here. The parser knows the Dockerfile grammar that matters for that —
logical lines (continuations, comments), parser directives, ``ARG`` defaults and their use in ``FROM`` — and the
shapes recipekit's own template writes: the per-architecture ``case`` that picks the torch build, ``pip install``
of ``name==version`` pins, and ``apt-get install`` of system packages. No I/O, no Docker.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

#: Build args every builder accepts without an ARG line (Docker's predefined proxy args).
PREDEFINED_ARGS = frozenset(
    name
    for base in ("HTTP_PROXY", "HTTPS_PROXY", "FTP_PROXY", "NO_PROXY", "ALL_PROXY")
    for name in (base, base.lower())
)
#: Args BuildKit and buildah set from --platform.
PLATFORM_ARGS = frozenset({"TARGETPLATFORM", "TARGETOS", "TARGETARCH", "TARGETVARIANT"})
_PIN = re.compile(r"(?<![\w.$-])([A-Za-z0-9][A-Za-z0-9_.-]*)==([A-Za-z0-9_.+!-]+)")
_CASE_TORCH = re.compile(r"([\w|]+)\)\s*torch=\"?torch==([A-Za-z0-9_.+!-]+)\"?")
_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::?-([^}]*))?\}|(\w+))")


@dataclass(frozen=True)
class Instruction:
    """One logical instruction: keyword (upper case), its arguments as written, and its first line number."""

    keyword: str
    args: str
    line: int


@dataclass
class Dockerfile:
    """What a Dockerfile builds from and installs."""

    instructions: list[Instruction]
    directives: dict[str, str]
    args: dict[str, str | None] = field(default_factory=dict)  # every ARG, its default (None: no default)
    base: str | None = None  # the last FROM, with ARG defaults substituted
    base_written: str | None = None  # the last FROM as written
    torch_builds: dict[str, str] = field(default_factory=dict)  # arch pattern word -> torch version
    pins: dict[str, str] = field(default_factory=dict)  # name (lower case, - for _) -> version, torch excluded
    apt_packages: list[str] = field(default_factory=list)  # words of every apt-get install, ARGs expanded
    index_urls: list[str] = field(default_factory=list)  # every --index-url / --extra-index-url value as written

    def run_text(self) -> str:
        return "\n".join(i.args for i in self.instructions if i.keyword == "RUN")

    def first(self, keyword: str) -> Instruction | None:
        return next((i for i in self.instructions if i.keyword == keyword), None)

    def torch_for(self, machine_words: tuple[str, ...]) -> str | None:
        """The torch build the ``case`` installs for an architecture, given the words that name it."""
        for pattern, version in self.torch_builds.items():
            if set(pattern.split("|")) & set(machine_words):
                return version
        return None


def normalize(name: str) -> str:
    """A distribution name as PyPI compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def instructions(text: str) -> tuple[list[Instruction], dict[str, str]]:
    """Logical instructions (continuation lines joined, comment lines dropped) and the parser directives."""
    directives: dict[str, str] = {}
    lines = text.splitlines()
    start = 0
    for start, line in enumerate(lines):  # noqa: B007 - the index after the directive block is used below
        match = re.match(r"^#\s*([A-Za-z]+)\s*=\s*(\S+)\s*$", line)
        if not match:
            break
        directives[match.group(1).lower()] = match.group(2)
    else:
        start = len(lines)
    found: list[Instruction] = []
    current, first_line = "", 0
    for number, line in enumerate(lines[start:], start=start + 1):
        stripped = line.strip()
        if stripped.startswith("#") or (not current and not stripped):
            continue
        if not current:
            first_line = number
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        keyword, _, rest = current.partition(" ")
        found.append(Instruction(keyword.upper(), rest.strip(), first_line))
        current = ""
    if current:
        keyword, _, rest = current.partition(" ")
        found.append(Instruction(keyword.upper(), rest.strip(), first_line))
    return found, directives


def substitute(text: str, values: dict[str, str | None]) -> str:
    """``$NAME``, ``${NAME}``, ``${NAME:-default}`` with ``values`` (unknown names become their default, or empty)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        known = values.get(name)
        return known if known else (match.group(2) or "")

    return _VARIABLE.sub(value, text)


def parse(text: str) -> Dockerfile:
    """Parse ``text``; never raises (what is missing is simply absent from the result)."""
    found, directives = instructions(text)
    result = Dockerfile(found, directives)
    for instruction in found:
        if instruction.keyword == "ARG":
            for word in shlex.split(instruction.args):
                name, sep, default = word.partition("=")
                result.args[name] = default if sep else result.args.get(name)
        elif instruction.keyword == "FROM":
            written = instruction.args.split()[0] if instruction.args.split() else ""
            if written.startswith("--platform"):
                parts = instruction.args.split()
                written = parts[1] if len(parts) > 1 else ""
            result.base_written = written
            result.base = substitute(written, result.args)
    runs = result.run_text()
    result.torch_builds = dict(_CASE_TORCH.findall(runs))
    for name, version in _PIN.findall(runs):
        if normalize(name) != "torch":
            result.pins[normalize(name)] = version
    for match in re.finditer(r"apt-get\s+install\s+([^&|;]*)", runs):
        words = substitute(match.group(1), result.args).split()
        result.apt_packages += [w.split("=")[0] for w in words if not w.startswith("-")]
    result.index_urls = re.findall(r"--(?:extra-)?index-url[= ]+(\S+)", runs)
    return result


def split_image(reference: str) -> tuple[str, str]:
    """``repository:tag`` (or ``repository@digest``) → (repository, tag or digest); no tag: ``latest``."""
    if "@" in reference:
        repository, _, digest = reference.partition("@")
        return repository, digest
    last = reference.rsplit("/", 1)[-1]
    if ":" in last:
        repository, _, tag = reference.rpartition(":")
        return repository, tag
    return reference, "latest"
