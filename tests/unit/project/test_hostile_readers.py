"""Hostile input to the readers of issue 31: the limit variables, and the files of a run, a plan and a bundle that
``report``, ``compare``, ``runs history``, ``rescale`` and ``model import`` read but did not write.

Each case runs the real command in a child process under the measuring wrapper (tests/measure.py), as the other
hostile-input tables do: the documented exit code, the reason on one line, no traceback, nothing written in the
case's directory, wall time and peak RSS under the bounds of tests/unit/project/test_hostile_input.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
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
    max_lines: int = 4  # a header and a line or two (a report that succeeds with a warning says more)
    slow: bool = False  # writes and reads a large file: half a minute or more


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
    assert "Traceback" not in output and "\x1b" not in output and "\x07" not in output, where  # no raw escapes
    assert any(probe.expect in line for line in said), where
    assert len(said) <= probe.max_lines and all(len(line) < 2000 for line in said), where
    assert snapshot(case) == before, f"{probe.id}: something was written in the case directory"
    assert result.wall_s < MAX_WALL_S and result.rss_mib < MAX_RSS_MIB, where


def surface(probes: list[Probe]) -> Any:
    params = [pytest.param(p, id=p.id, marks=[pytest.mark.slow] if p.slow else []) for p in probes]
    return pytest.mark.parametrize("probe", params)


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


# ------------------------------------------------------------------------------------ report, compare, history
def _run(case: Path, files: dict[str, str | bytes] | None = None) -> Path:
    """A run's output directory (runfixtures' metrics.jsonl) with ``files`` written or replaced in it."""
    from tests.unit.runfixtures import PLAN, losses, write_run

    run = write_run(case / "run", losses())
    (case / "plan.json").write_text(json.dumps(PLAN))
    for name, content in (files or {}).items():
        (run / name).write_bytes(content.encode() if isinstance(content, str) else content)
    return run


def _report(files: dict[str, str | bytes] | None = None, *, plan: bytes | None = None):
    def setup(case: Path) -> list[str]:
        _run(case, files)
        if plan is not None:
            (case / "plan.json").write_bytes(plan)
        return ["report", "{case}/run", "--plan", "{case}/plan.json", "-o", str(case.parent / "report-out")]

    return setup


def _special(name: str, make: Any, *command: str):
    def setup(case: Path) -> list[str]:
        _run(case)
        make(case / name)
        return [c.replace("{out}", str(case.parent / "report-out")) for c in command]

    return setup


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _to(target: str):
    def make(path: Path) -> None:
        path.unlink(missing_ok=True)
        path.symlink_to(target)

    return make


def _link_out(path: Path) -> None:
    secret = path.parent.parent / "secret.json"
    secret.write_text('{"ok": true}')
    _to(str(secret))(path)


def _metrics_lines(lines: list[str]):
    def setup(case: Path) -> list[str]:
        run = _run(case)
        with (run / "metrics.jsonl").open("a") as handle:
            handle.writelines(line + "\n" for line in lines)
        return ["report", "{case}/run", "-o", str(case.parent / "report-out")]

    return setup


def _many_lines(case: Path) -> list[str]:
    run = _run(case)
    with (run / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 1}\n' * 1_100_000)
    return ["report", "{case}/run", "-o", str(case.parent / "report-out")]


DEEP = b"[" * 100_000 + b"]" * 100_000
REPORT_OUT = ["-o", "{out}"]
REPORT_SURFACE = [
    Probe("cluster-check.json a FIFO", _special("run/cluster-check.json", _fifo, "report", "{case}/run", *REPORT_OUT),
          "cluster-check.json: cannot be read"),
    Probe("cluster-check.json a link to /dev/zero",
          _special("run/cluster-check.json", _to("/dev/zero"), "report", "{case}/run", *REPORT_OUT),
          "is not a regular file"),
    Probe("cluster-check.json a link out of the run",
          _special("run/cluster-check.json", _link_out, "report", "{case}/run", *REPORT_OUT), "leads out of"),
    Probe("cluster-check.json nested 100,000 deep", _report({"cluster-check.json": DEEP}),
          "nested more than 64 levels"),
    Probe("cluster-check.json ok: 'yes'", _report({"cluster-check.json": '{"ok": "yes"}'}),
          "ok is 'yes': expected true or false"),
    Probe("recipekit-run.json a FIFO", _special("run/recipekit-run.json", _fifo, "report", "{case}/run", *REPORT_OUT),
          "recipekit-run.json: cannot be read"),
    Probe("--plan a FIFO", _special("plan.json", _fifo, "report", "{case}/run", "--plan", "{case}/plan.json",
                                    *REPORT_OUT), "plan.json: cannot be read"),
    Probe("--plan world_size '2'", _report(plan=b'{"layout": {"world_size": "2"}}'),
          "layout.world_size is '2': expected a whole number"),
    Probe("--plan step_s 1e400 (inf)", _report(plan=b'{"time": {"step_s": 1e400}}'),
          "time.step_s is inf: expected a finite number"),
    Probe("--plan nested 100,000 deep", _report(plan=DEEP), "nested more than 64 levels"),
    Probe("metrics.jsonl: a step of 10**400, NaN, a string", _metrics_lines(
        ['{"step": 1' + "0" * 400 + ', "loss": 1.0}', '{"step": 9, "loss": NaN}', '{"step": "9", "loss": 1.0}',
         '{"event": "start", "tensor_parallel": "8"}', "[" * 100_000]),
          "4 line(s) skipped", code=0, max_lines=60),
    Probe("metrics.jsonl of 1.1 million lines", _many_lines, "only the first 1,000,000 lines", code=0, max_lines=60,
          slow=True),
]  # fmt: skip


@surface(REPORT_SURFACE)
def test_report_surface(probe: Probe, tmp_path: Path) -> None:
    check(probe, tmp_path)


def _baseline(content: bytes):
    def setup(case: Path) -> list[str]:
        _run(case)
        (case / "base.json").write_bytes(content)
        return ["compare", "{case}/run", "--baseline", "{case}/base.json"]

    return setup


BASE = '{"format": "recipekit-baseline/1", "records": [], '
COMPARE_SURFACE = [
    Probe("--baseline nested 100,000 deep", _baseline(DEEP), "nested more than 64 levels"),
    Probe("--baseline a FIFO", _special("base.json", _fifo, "compare", "{case}/run", "--baseline", "{case}/base.json"),
          "no such run directory, bundle or baseline file"),
    Probe("--baseline plan step_s 'fast'", _baseline((BASE + '"plan": {"time": {"step_s": "fast"}}}').encode()),
          "plan.time.step_s is 'fast': expected a finite number"),
    Probe("--baseline records not a list", _baseline(b'{"format": "recipekit-baseline/1", "records": "x"}'),
          "records is 'x': expected a list"),
    Probe("a run's cluster-check.json a FIFO",
          _special("run/cluster-check.json", _fifo, "compare", "{case}/run", "{case}/run"),
          "cluster-check.json: cannot be read"),
    Probe("a run's cluster-check.json with algbw 'fast'", _special(
        "run/cluster-check.json",
        lambda p: p.write_text('{"ok": true, "checks": [{"check": "allreduce", "results": '
                               '[{"size_mb": 1, "algbw_gbps": "fast"}]}]}'),
        "report", "{case}/run", "-o", "{out}"), "report: ", code=0, max_lines=60),
]  # fmt: skip


@surface(COMPARE_SURFACE)
def test_compare_surface(probe: Probe, tmp_path: Path) -> None:
    check(probe, tmp_path)


def _recovery(content: bytes | None = None, make: Any = None):
    def setup(case: Path) -> list[str]:
        run = case / "run"
        run.mkdir()
        path = run / "recovery.jsonl"
        if content is not None:
            path.write_bytes(content)
        if make is not None:
            make(path)
        return ["runs", "history", "{case}/run"]

    return setup


def _records(*records: Any) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


INTERRUPTED = {"step": 7, "time": 1000.0}
HISTORY_SURFACE = [
    Probe("recovery.jsonl a FIFO", _recovery(make=_fifo), "recovery.jsonl: cannot be read"),
    Probe("recovery.jsonl a link to /proc/self/environ", _recovery(make=_to("/proc/self/environ")), "leads out of"),
    Probe("recovery.jsonl a link to /dev/zero", _recovery(make=_to("/dev/zero")), "not a regular file"),
    Probe("times that are a string, NaN and 1e20, no launch time", _recovery(_records(
        {"event": "start", "time": "x", "interrupted": INTERRUPTED},
        {"event": "start", "time": float("nan"), "interrupted": INTERRUPTED},
        {"event": "start", "time": 1e20, "interrupted": INTERRUPTED},
        {"event": "start", "interrupted": {"step": "7", "time": 1000.0}},
        {"event": "start", "time": 1100.0, "interrupted": INTERRUPTED},
        {"event": "first_step", "step": 10**400 if False else 8, "time": 1e300},
    )), "1 recovery(ies)", code=0, max_lines=8),
    Probe("a line nested 30,000 deep and one of 1 MiB", _recovery(b"[" * 30_000 + b"\n" + b"x" * (1 << 20) + b"\n"),
          "warning: recovery.jsonl: line 1: JSON nested more than 64 levels deep", code=0),
]  # fmt: skip


@surface(HISTORY_SURFACE)
def test_history_surface(probe: Probe, tmp_path: Path) -> None:
    check(probe, tmp_path)


# ------------------------------------------------------------------------------------------------ model import
QWEN = {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}


def _config(content: bytes | None = None, make: Any = None):
    def setup(case: Path) -> list[str]:
        path = case / "model" / "config.json"
        path.parent.mkdir()
        if content is not None:
            path.write_bytes(content)
        if make is not None:
            make(path)
        return ["model", "import", "{case}/model/config.json", "-o", str(case.parent / "o.yaml")]

    return setup


def _qwen(**values: Any) -> bytes:
    return json.dumps({**QWEN, **values}).encode()


MODEL_SURFACE = [
    Probe("config.json of 5 MiB", _config(_qwen(padding="x" * (5 << 20))), "larger than 4194304 bytes"),
    Probe("config.json nested 100,000 deep", _config(DEEP), "nested more than 64 levels deep"),
    Probe("config.json not UTF-8", _config(b'{"model_type": "qwen\xff"}'), "not UTF-8"),
    Probe("config.json a link to /dev/zero", _config(make=_to("/dev/zero")), "no such file"),
    Probe("10**9 layers", _config(_qwen(num_hidden_layers=10**9)), "num_hidden_layers is 1000000000: expected"),
    Probe("a vocabulary of 10**12", _config(_qwen(vocab_size=10**12)), "vocab_size is 1000000000000: expected"),
    Probe("hidden_size '64'", _config(_qwen(hidden_size="64")), "hidden_size is '64': expected a whole number"),
    Probe("num_local_experts true", _config(_qwen(num_local_experts=True)), "num_local_experts is True"),
]


@surface(MODEL_SURFACE)
def test_model_import_surface(probe: Probe, tmp_path: Path) -> None:
    check(probe, tmp_path)


# --------------------------------------------------------------------------------------- older findings (item 5)
def _two_bundles(plant: Any):
    def setup(case: Path) -> list[str]:
        from recipekit.bundle.build import build

        a = build(["recipe=tiny_sft"], case / "a", force=True).path
        b = build(["recipe=tiny_sft"], case / "b", force=True).path
        plant(b)
        return ["diff", str(a), str(b)]

    return setup


def _escape_name(bundle: Path) -> None:
    (bundle / "runtime" / "x\x1b[2J\x1b]0;owned\x07.py").write_text("print('hi')\n")


DIFF_SURFACE = [
    Probe("a FIFO in a bundle", _two_bundles(lambda b: os.mkfifo(b / "notes.txt")), "notes.txt", code=1),
    Probe("a symlink to /proc in a bundle",
          _two_bundles(lambda b: (b / "runtime" / "p.py").symlink_to("/proc/1/environ")),
          "runtime/p.py (a link, FIFO, device or directory", code=1),
    Probe("a file name with terminal escapes", _two_bundles(_escape_name), "x\\x1b[2J\\x1b]0;owned\\x07.py", code=1,
          max_lines=12),
]  # fmt: skip


@surface(DIFF_SURFACE)
def test_diff_surface(probe: Probe, tmp_path: Path) -> None:
    check(probe, tmp_path)


def test_diff_passes_no_control_character_to_the_terminal(tmp_path: Path) -> None:
    from recipekit.handover.diff import Side, diff

    a = Side("a", {"run.sh": b"echo hi\n"}, {"name": "x"})
    b = Side("b", {"run.sh": b"echo \x1b[31mred\n", "\x1b]0;t\x07": b""}, {"name": "\x1b[2Jx"})
    lines = diff(a, b)
    assert lines and not any(ch in line for line in lines for ch in "\x1b\x07")


def _prepared(name: str):
    def setup(case: Path) -> list[str]:
        from recipekit.runtime.volume import manifest

        prepared = case / "prepared" / "fp"
        (prepared / "shards").mkdir(parents=True)
        shard = {"name": name, "rows": 1, "tokens": 4, "sha256": {".bin": "0" * 64}}
        document = {"format": manifest.FORMAT, "version": manifest.VERSION, "token_dtype": "uint16",
                    "splits": {"train": {"rows": 1, "tokens": 4, "shards": [shard]}}}  # fmt: skip
        (prepared / "manifest.json").write_text(json.dumps(document))
        (case / "outside.bin").write_bytes(b"\0" * 8)
        return ["data", "verify", "--prepared", str(prepared)]

    return setup


def _fifo_shard(case: Path) -> list[str]:
    args = _prepared("train-0")(case)
    os.mkfifo(case / "prepared" / "fp" / "shards" / "train-0.bin")
    return args


VERIFY_SURFACE = [
    Probe("a shard named ../../outside", _prepared("../../outside"), "is not a plain file name"),
    Probe("a shard name with terminal escapes", _prepared("x\x1b[2J"), "x1b[2J' is not a plain file name"),
    Probe("a FIFO as a shard", _fifo_shard, "missing: ", code=1, max_lines=6),
]


@surface(VERIFY_SURFACE)
def test_data_verify_surface(probe: Probe, tmp_path: Path) -> None:
    check(probe, tmp_path)


def _directory_as_package(case: Path) -> list[str]:
    (case / "pkg.tar.gz").mkdir()
    return ["verify", "{case}/pkg.tar.gz"]


@surface([Probe("verify of a directory given as a package", _directory_as_package, "is not a regular file")])
def test_verify_surface(probe: Probe, tmp_path: Path) -> None:
    check(probe, tmp_path)


def _pack_alias_bomb(case: Path) -> list[str]:
    from tests.unit.project.test_hostile_input import ALIAS_BOMB

    team = case / "team"
    write_tree(team, {"recipe/mine.yaml": "# @package _global_\ndefaults:\n  - tiny_sft\n  - _self_\n"})
    from recipekit.bundle.build import build

    bundle = build(["recipe=mine"], case / "b", extra_dirs=[team], force=True).path
    (team / "recipe" / "mine.yaml").write_text(ALIAS_BOMB.replace("name: bomb", "name: mine"))
    return ["pack", str(bundle), "-o", str(case.parent / "packed")]


@surface([Probe("pack of a bundle whose team layer became an alias bomb", _pack_alias_bomb, "alias bomb")])
def test_pack_surface(probe: Probe, tmp_path: Path) -> None:
    check(probe, tmp_path)
