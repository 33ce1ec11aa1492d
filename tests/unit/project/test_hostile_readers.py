"""Hostile input to the readers of issue 31: the limit variables, and the files of a run, a plan and a bundle that
``report``, ``compare``, ``runs history``, ``rescale`` and ``model import`` read but did not write.

Each case runs the real command in a child process under the measuring wrapper (tests/measure.py), as the other
hostile-input tables do: the documented exit code, the reason on one line, no traceback, nothing written in the
case's directory, wall time and peak RSS under the bounds of tests/unit/project/test_hostile_input.py.
"""

from __future__ import annotations

import dataclasses
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from recipekit.base import limits
from recipekit.base.errors import RecipeError
from tests.unit.project.test_hostile_input import MAX_RSS_MIB, MAX_WALL_S, run_measured, snapshot, write_tree


@dataclasses.dataclass(frozen=True)
class Probe:
    """One hostile input: ``setup(case)`` writes it under the case directory and returns the CLI args; ``env`` is
    added to the command's environment; ``expect`` is in the one line that says why; ``code`` the exit code."""

    id: str
    setup: Any
    expect: str
    env: tuple[tuple[str, str], ...] = ()
    code: int = 2


def check(probe: Probe, tmp_path: Path) -> None:
    case = tmp_path / "case"
    case.mkdir()
    args = [a.replace("{case}", str(case)) for a in probe.setup(case)]
    before = snapshot(case)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path / "home"), **dict(probe.env)}
    result = run_measured(args, case, env=env)
    output = result.stderr + result.stdout
    said = [line for line in output.splitlines() if line.strip() and not line.startswith("recipekit: using")]
    where = f"{probe.id}: exit {result.code}, {result.wall_s:.1f} s, {result.rss_mib:.0f} MiB\n{output[-3000:]}"
    assert result.code == probe.code, where
    assert "Traceback" not in output, where
    assert any(probe.expect in line for line in said), where
    assert len(said) <= 4 and all(len(line) < 2000 for line in said), where  # a header and a line or two
    assert snapshot(case) == before, f"{probe.id}: something was written in the case directory"
    assert result.wall_s < MAX_WALL_S and result.rss_mib < MAX_RSS_MIB, where


def surface(probes: list[Probe]) -> Any:
    return pytest.mark.parametrize("probe", [pytest.param(p, id=p.id) for p in probes])


# ----------------------------------------------------------------------------------------------------- limits
TOML = 'name = "team"\nrecipekit = ">=0.0"\nsearch_path = ["recipes"]\n'


def _team(case: Path) -> list[str]:
    write_tree(case, {"recipekit.toml": TOML, "recipes/cluster/.keep": ""})
    return ["list", "cluster"]


def _limit(value: str) -> tuple[tuple[str, str], ...]:
    return (("RECIPEKIT_LIMIT_TOML_KIB", value),)


BAD_LIMITS = {
    "superscript two": "\u00b2",
    "Arabic-Indic three": "\u0663",
    "thirty nines": "9" * 30,
    "100 TiB in KiB": str(100 << 30),
    "zero": "0",
    "negative": "-1",
    "a space": " 8",
    "hexadecimal": "0x10",
    "underscores": "1_000",
    "a float": "8.0",
}
LIMIT_SURFACE = [
    Probe(f"RECIPEKIT_LIMIT_TOML_KIB: {name}", _team, "RECIPEKIT_LIMIT_TOML_KIB: ", _limit(value))
    for name, value in BAD_LIMITS.items()
]


@surface(LIMIT_SURFACE)
def test_limit_surface(probe: Probe, tmp_path: Path) -> None:
    check(probe, tmp_path)


@pytest.mark.parametrize("value", list(BAD_LIMITS.values()))
def test_a_limit_is_plain_digits_within_its_range_or_one_line(value: str, monkeypatch) -> None:
    monkeypatch.setenv(limits.TOML_FILE.variable, value)
    with pytest.raises(RecipeError) as raised:
        _ = limits.TOML_FILE.value
    (problem,) = raised.value.problems
    assert problem.key == "RECIPEKIT_LIMIT_TOML_KIB" and "not a whole number from 1 to 65,536" in problem.message
    monkeypatch.setenv(limits.TOML_FILE.variable, "128")
    assert limits.TOML_FILE.bytes == 128 << 10
    monkeypatch.setenv(limits.TOML_FILE.variable, "")
    assert limits.TOML_FILE.value == limits.TOML_FILE.default


def test_no_limit_is_allocated_before_reading(tmp_path: Path, monkeypatch) -> None:
    """``read(limit + 1)`` allocated the whole limit first: 16 GiB for a 1 KiB file at the largest bundle limit."""
    monkeypatch.setenv(limits.BUNDLE_FILE.variable, str(limits.BUNDLE_FILE.maximum))
    small = tmp_path / "small.json"
    small.write_bytes(b"{}" * 512)
    tracemalloc.start()
    try:
        assert limits.read_regular(small, limits.BUNDLE_FILE) == b"{}" * 512
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


@pytest.mark.parametrize("value", ["\u00b2", "9" * 30, str(1 << 40), "0", " 64"])
def test_the_pods_data_limits_are_parsed_as_strictly(value: str, monkeypatch) -> None:
    from recipekit.runtime.data.records import DataError
    from recipekit.runtime.data.sources import record_limit

    monkeypatch.setenv("RECIPEKIT_LIMIT_RECORD_MIB", value)
    with pytest.raises(DataError, match="RECIPEKIT_LIMIT_RECORD_MIB.*not a whole number from 1 to 65536"):
        record_limit()
    monkeypatch.setenv("RECIPEKIT_LIMIT_RECORD_MIB", "128")
    assert record_limit() == 128 << 20
