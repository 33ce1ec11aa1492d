"""Hostile input to the readers of issue 31: the limit variables, and the files of a run, a plan and a bundle that
``report``, ``compare``, ``runs history``, ``rescale`` and ``model import`` read but did not write.

Each case runs the real command in a child process under the measuring wrapper (tests/measure.py), as the other
hostile-input tables do: the documented exit code, the reason on one line, no traceback, nothing written in the
case's directory, wall time and peak RSS under the bounds of tests/unit/project/test_hostile_input.py.
"""

from __future__ import annotations

import dataclasses
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml

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


# ---------------------------------------------------------------------------------------------------- rescale
def _bundle(case: Path) -> Path:
    from recipekit.bundle.build import build

    return build(["recipe=tiny_sft"], case / "b", force=True).path


def _edited_plan(**values: Any):
    def setup(case: Path) -> list[str]:
        bundle = _bundle(case)
        doc = yaml.safe_load((bundle / "recipe.yaml").read_text())
        doc["plan"].update(values)
        (bundle / "recipe.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        return ["rescale", str(bundle), "--nodes", "1", "-o", "{case}/out"]

    return setup


def _manifest(content: bytes):
    def setup(case: Path) -> list[str]:
        bundle = _bundle(case)
        (bundle / "manifest.json").write_bytes(content)
        return ["rescale", str(bundle), "--nodes", "1", "-o", "{case}/out"]

    return setup


def _moved_output(case: Path) -> list[str]:
    bundle = _bundle(case)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["overrides"].append("cluster.output_dir=/mnt/shared/elsewhere")
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return ["rescale", str(bundle), "--nodes", "1", "-o", "{case}/out"]


RESCALE_SURFACE = [
    Probe("plan.nodes 10**12", _edited_plan(nodes=10**12), "plan.nodes: 1000000000000: expected a whole number"),
    Probe("plan.tensor_parallel '8'", _edited_plan(tensor_parallel="8"), "plan.tensor_parallel: '8': expected"),
    Probe("plan.micro_batch_size true", _edited_plan(micro_batch_size=True), "plan.micro_batch_size: True"),
    Probe("plan.zero_stage 'fast'", _edited_plan(zero_stage="fast"), "plan.zero_stage: 'fast': expected 0 to 3"),
    Probe("manifest.json nested 100,000 deep", _manifest(b"[" * 100_000), "JSON nested more than 64 levels deep"),
    Probe("manifest.json not UTF-8", _manifest(b'{"overrides": ["\xff"]}'), "not UTF-8"),
    Probe("manifest overrides move cluster.output_dir", _moved_output, "the rebuild's recipe.cluster.output_dir is"),
]


@surface(RESCALE_SURFACE)
def test_rescale_surface(probe: Probe, tmp_path: Path) -> None:
    check(probe, tmp_path)
