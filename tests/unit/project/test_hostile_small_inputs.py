"""Small hostile files that ended in a traceback: a few KB of JSON, TOML or YAML from someone else.

Each was a file recipekit reads but did not write — a package's index, a bundle's manifest.json and recipe.yaml, a
prepared dataset's manifest, a team's recipekit.toml, a line of training data — nested 100,000 deep, not UTF-8, or
shaped wrong. The promise is the one for every bad input: exit code 2, one problem line naming the file, no
traceback, nothing written, and promptly, in little memory. Every case runs the real command in its own process
(through a small wrapper that measures the command's wall time and peak RSS), with HOME, TMPDIR and the working
directory inside the case's own directory, which must be byte for byte the same afterwards.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.cli import main
from tests.measure import Measured
from tests.measure import measure as measure_command

#: 100,000 levels of JSON in 100 KB: past Python's recursion limit, so json.loads raised RecursionError.
DEEP_JSON = "[" * 100_000
#: Bounds for a refused input: the CLI's own start-up (Hydra, pydantic) is most of both, on a busy 2-core machine.
MAX_WALL_S = 45.0
MAX_RSS_MIB = 400.0
#: What a hostile bundle file may add to `validate`'s own peak on the good bundle, measured in the same run: its static
#: checks of a whole bundle peak near MAX_RSS_MIB by themselves (402 MiB seen on a loaded 2-core machine).
HOSTILE_FILE_HEADROOM_MIB = 48.0


@dataclass(frozen=True)
class Case:
    """``make(root, bundle)`` writes the hostile input under ``root`` (from a copy of a good ``bundle`` where it
    needs one) and returns the command's arguments; the command runs in ``root/work``; its one problem line must
    contain ``expect``."""

    name: str
    make: Callable[[Path, Path], list[str]]
    expect: str
    slow: bool = False
    max_wall_s: float = MAX_WALL_S
    max_rss_mib: float = MAX_RSS_MIB


def measure(args: list[str], cwd: Path, env: dict[str, str], limit_s: float) -> Measured:
    """`recipekit ARGS`, measured by the shared wrapper (tests/measure.py)."""
    return measure_command([sys.executable, "-m", "recipekit.cli", *args], cwd, env, limit_s)


def problem_lines(stderr: str) -> list[str]:
    """The problems reported on stderr: ``error: 1 problem:`` and its item, or a single ``error: ...`` line."""
    lines = stderr.strip().splitlines()
    if lines and lines[0].startswith("error: ") and lines[0].endswith(("problem:", "problems:")):
        return lines[1:]
    return lines


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``: a file's bytes, a link's target, '' for a directory."""
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            found[name] = f"-> {os.readlink(path)}"
        elif path.is_dir():
            found[name] = ""
        else:
            found[name] = path.read_bytes()
    return found


# --------------------------------------------------------------------------------------------------- inputs
def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def targz(path: Path, members: dict[str, str | bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, content in members.items():
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def copy(bundle: Path, root: Path, changes: dict[str, str | bytes]) -> Path:
    target = root / "bad"
    shutil.copytree(bundle, target)
    for name, content in changes.items():
        write(target / name, content)
    return target


def nested(depth: int) -> list:
    """A list ``depth`` levels deep."""
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


INDEX = {
    "format": "recipekit-package/1",
    "recipekit_version": "0.1.0",
    "name": "x",
    "overrides": [],
    "origin": [],
    "layers": [],
    "files": {},
}


def team(root: Path, toml: str | bytes, *links: tuple[str, str]) -> Path:
    """The working directory holds ``toml`` as its recipekit.toml (and the symlinks ``links``: name → target)."""
    write(root / "work" / "recipekit.toml", toml)
    for name, target in links:
        (root / "work" / name).symlink_to(target)
    return root / "work"


TEAM_HEAD = 'name = "team"\nrecipekit = ">=0.1"\n'
PREPARED = {"format": "recipekit-prepared", "version": 1}

CASES = [
    # packages (verify)
    Case(
        "package index nested 100k deep",
        lambda root, b: ["verify", str(targz(root / "p.tar.gz", {"p/recipekit-package.json": DEEP_JSON}))],
        "recipekit-package.json: JSON nested more than 64 levels deep",
    ),
    Case(
        "package index not UTF-8",
        lambda root, b: ["verify", str(targz(root / "p.tar.gz", {"p/recipekit-package.json": b"\xff{}"}))],
        "recipekit-package.json: not UTF-8 text",
    ),
    Case(
        "package's bundle manifest nested 100k deep",
        lambda root, b: [
            "verify",
            str(
                targz(
                    root / "p.tar.gz",
                    {"p/recipekit-package.json": json.dumps(INDEX), "p/bundle/manifest.json": DEEP_JSON},
                )
            ),
        ],
        "bundle/manifest.json: JSON nested more than 64 levels deep",
    ),
    # diff
    Case(
        "diff: a bundle manifest nested 100k deep",
        lambda root, b: ["diff", str(b), str(copy(b, root, {"manifest.json": DEEP_JSON}))],
        "manifest.json: JSON nested more than 64 levels deep",
    ),
    # prepared data (plan --data)
    Case(
        "plan --data: prepared manifest nested 100k deep",
        lambda root, b: ["plan", "recipe=tiny_sft", "--data", str(write(root / "prep" / "manifest.json", DEEP_JSON))],
        "manifest.json: JSON nested more than 64 levels deep",
    ),
    Case(
        "plan --data: prepared manifest nested 100 deep (loads, then would overflow a walker)",
        lambda root, b: [
            "plan",
            "recipe=tiny_sft",
            "--data",
            str(write(root / "prep" / "manifest.json", json.dumps({**PREPARED, "x": nested(99)}))),
        ],
        "JSON nested more than 64 levels deep",
    ),
    Case(
        "plan --data: non-numeric counts",
        lambda root, b: [
            "plan",
            "recipe=tiny_sft",
            "--data",
            str(write(root / "m.json", json.dumps({**PREPARED, "splits": {"train": {"rows": "many", "tokens": 1}}}))),
        ],
        "the train split's rows and tokens are 'many' and 1, not counts",
    ),
    Case(
        "plan --data: counts that are lists",
        lambda root, b: [
            "plan",
            "recipe=tiny_sft",
            "--data",
            str(write(root / "m.json", json.dumps({**PREPARED, "splits": {"train": {"rows": [1], "tokens": True}}}))),
        ],
        "not counts",
    ),
    Case(
        "plan --data: manifest not UTF-8",
        lambda root, b: ["plan", "recipe=tiny_sft", "--data", str(write(root / "m.json", b'{"a": "\xff"}'))],
        "m.json: not UTF-8 text",
    ),
    # team trees (recipekit.toml in the working directory)
    Case(
        # under the 64 KiB TOML limit (recipekit.base.limits.TOML_FILE), so the depth bound is what refuses them
        "recipekit.toml: arrays nested 30k deep (build)",
        lambda root, b: team(root, f"{TEAM_HEAD}x = {'[' * 30_000}{']' * 30_000}\n") and ["build", "recipe=tiny_sft"],
        "recipekit.toml: nested more than 16 levels deep",
    ),
    Case(
        "recipekit.toml: inline tables nested 15k deep (list)",
        lambda root, b: team(root, f"{TEAM_HEAD}x = {'{a=' * 15_000}1{'}' * 15_000}\n") and ["list"],
        "recipekit.toml: nested more than 16 levels deep",
    ),
    Case(
        "recipekit.toml: a dotted table 10k deep (show)",
        lambda root, b: team(root, f"{TEAM_HEAD}[{'.'.join(['a'] * 10_000)}]\n") and ["show", "recipe=tiny_sft"],
        "recipekit.toml: nested more than 16 levels deep",
    ),
    Case(
        "recipekit.toml: not UTF-8",
        lambda root, b: team(root, TEAM_HEAD.encode() + b'x = "\xff"\n') and ["build", "recipe=tiny_sft"],
        "recipekit.toml: is not UTF-8 text",
    ),
    Case(
        "recipekit.toml: a search_path symlink loop",
        lambda root, b: team(root, f'{TEAM_HEAD}search_path = ["loop"]\n', ("loop", "loop")) and ["list"],
        "search_path: 'loop' is a symlink loop",
    ),
    Case(
        "recipekit.toml: a search_path through two links that point at each other",
        lambda root, b: team(root, f'{TEAM_HEAD}search_path = ["a/x"]\n', ("a", "b"), ("b", "a")) and ["list"],
        "search_path: 'a/x' is a symlink loop",
    ),
    # image build (no engine is reached: each is refused before)
    Case(
        "image build: --engine 'tcp://[::1'",
        lambda root, b: ["image", "build", str(copy(b, root, {})), "--engine", "tcp://[::1"],
        "engine: ",
    ),
    Case(
        "image build: manifest nested 100k deep",
        lambda root, b: ["image", "build", str(copy(b, root, {"manifest.json": DEEP_JSON}))],
        "not a recipekit bundle (manifest.json is not UTF-8 JSON)",
    ),
    Case(
        "image build: recipe.yaml not UTF-8",
        lambda root, b: ["image", "build", str(copy(b, root, {"recipe.yaml": b"recipe: \xff\n"}))],
        "recipe.yaml:1: is not UTF-8 text",
    ),
    Case(
        "image build: recipe.yaml nested 100k deep",
        lambda root, b: ["image", "build", str(copy(b, root, {"recipe.yaml": DEEP_JSON}))],
        "recipe.yaml",
    ),
    Case(
        "image build: recipe.yaml whose recipe is a number",
        lambda root, b: ["image", "build", str(copy(b, root, {"recipe.yaml": "recipe: 5\nplan: {}\n"}))],
        "not a recipekit recipe.yaml",
    ),
    Case(
        "image build: recipe.yaml whose hw.arch is a list",
        lambda root, b: ["image", "build", str(copy(b, root, {"recipe.yaml": "recipe: {hw: {arch: [x]}}\n"}))],
        "recipe.hw.arch: ['x'] is not an architecture name",
    ),
    Case(
        "image build: Dockerfile not UTF-8",
        lambda root, b: ["image", "build", str(copy(b, root, {"Dockerfile": b"FROM \xff\n"}))],
        # its bytes are checked against manifest.json before anything parses them (handover/buildcontext.py)
        "Dockerfile: was edited after the build",
    ),
    # data prepare / verify: the bundle's recipe.yaml
    Case(
        "data prepare: recipe.yaml not UTF-8",
        lambda root, b: ["data", "prepare", str(copy(b, root, {"recipe.yaml": b"\xff\xfe"}))],
        "recipe.yaml:1: is not UTF-8 text",
    ),
    Case(
        "data prepare: recipe.yaml nested 100k deep",
        lambda root, b: ["data", "prepare", str(copy(b, root, {"recipe.yaml": DEEP_JSON}))],
        "recipe.yaml:1: ",
    ),
    Case(
        "data prepare: recipe.yaml nested 100 deep",
        lambda root, b: ["data", "prepare", str(copy(b, root, {"recipe.yaml": "a: " + "[" * 100 + "]" * 100}))],
        "recipe.yaml:1: nested more than 64 levels deep",
    ),
    Case(
        "data verify --prepared: manifest nested 100k deep",
        lambda root, b: ["data", "verify", "--prepared", str(write(root / "prep" / "manifest.json", DEEP_JSON).parent)],
        "manifest.json: JSON nested more than 64 levels deep",
    ),
    Case(
        "data verify: recipe.yaml not UTF-8",
        lambda root, b: ["data", "verify", str(copy(b, root, {"recipe.yaml": b"\xff\xfe"}))],
        "recipe.yaml:1: is not UTF-8 text",
    ),
]


@pytest.fixture(scope="module")
def good_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("good") / "bundle"
    result = CliRunner().invoke(main, ["build", "recipe=tiny_sft", "-o", str(target)])
    assert result.exit_code == 0, result.output
    return target


@pytest.fixture(scope="module")
def good_validate_rss_mib(good_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> float:
    """`validate`'s peak memory on the good bundle: the baseline a hostile file's finding is measured against."""
    work = tmp_path_factory.mktemp("good-validate")
    done = measure(["validate", str(good_bundle)], work, {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}, MAX_WALL_S)
    assert done.code == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.rss_mib


def run_case(case: Case, tmp_path: Path, bundle: Path) -> None:
    root = tmp_path / "case"
    for name in ("work", "home", "tmp"):
        (root / name).mkdir(parents=True, exist_ok=True)
    args = case.make(root, bundle)
    before = snapshot(root)
    env = {**os.environ, "HOME": str(root / "home"), "TMPDIR": str(root / "tmp"), "NO_COLOR": "1"}
    env.pop("XDG_CACHE_HOME", None)
    done = measure(args, root / "work", env, case.max_wall_s)
    problems = problem_lines(done.stderr)
    assert done.code == 2, (done.code, done.stderr[-2000:])
    assert "Traceback" not in done.stderr + done.stdout
    assert len(problems) == 1 and case.expect in problems[0], done.stderr
    assert len(problems[0]) < 600, problems[0]  # one line: the problem, its hint and the equivalent command
    assert snapshot(root) == before, "the command wrote or changed files"
    assert done.wall_s < case.max_wall_s, f"{done.wall_s:.1f} s"
    assert done.rss_mib < case.max_rss_mib, f"{done.rss_mib:.0f} MiB"


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_a_small_hostile_file_is_one_line_exit_2_promptly(case: Case, tmp_path: Path, good_bundle: Path) -> None:
    run_case(case, tmp_path, good_bundle)


# ------------------------------------------------------------------------------------ the runtime's readers
def _records(path: Path, fmt: str = "alpaca") -> list:
    """Every record of the data at ``path`` as the prepare step reads it; the first problem as a DataError."""
    from recipekit.runtime.data import records, sources

    files = sources.find_files(str(path), fmt)
    items = [i for c in sources.plan_chunks(files, 1 << 20) for i in sources.read_chunk(files[c.file], c, fmt)]
    for item in items:
        problem = item.checked(fmt)
        if problem is not None:
            raise records.DataError(item.locate(), problem[0], field=problem[1])
    return [item.record for item in items]


GOOD_LINE = '{"instruction": "a", "output": "b"}'


@pytest.mark.parametrize(
    "name, content, expect",
    [
        ("data.jsonl", f"{GOOD_LINE}\n{DEEP_JSON}\n", ":2: JSON nested more than 64 levels deep"),
        ("data.jsonl", f'{GOOD_LINE}\n{{"instruction": {json.dumps(nested(80))}}}\n', ":2: JSON nested more than 64"),
        ("data.jsonl", f'{GOOD_LINE}\n{{"instruction": {"9" * 5000}}}\n', ":2: not valid JSON"),
        ("data.jsonl", f'{GOOD_LINE}\n{{"x": 1,\n', ":2: not valid JSON (Expecting"),
        ("data.json", f"[{GOOD_LINE},\n{DEEP_JSON}]", ":2: JSON nested more than 64 levels deep; the array cannot"),
        ("data.json", f'[{GOOD_LINE},\n{{"instruction": {json.dumps(nested(80))}}}]', ":2: JSON nested more than 64"),
    ],
    ids=["jsonl 100k deep", "jsonl 80 deep", "jsonl 5000-digit number", "jsonl broken", "array 100k", "array 80"],
)
def test_a_data_record_nested_too_deep_is_a_bad_record_naming_its_line(
    tmp_path: Path, name: str, content: str, expect: str
) -> None:
    from recipekit.runtime.data.records import DataError

    path = write(tmp_path / name, content)
    with pytest.raises(DataError) as raised:
        _records(path)
    assert expect in str(raised.value) and str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_a_gzipped_data_line_nested_too_deep_is_a_bad_record(tmp_path: Path) -> None:
    import gzip

    from recipekit.runtime.data.records import DataError

    path = tmp_path / "data.jsonl.gz"
    path.write_bytes(gzip.compress(f"{GOOD_LINE}\n{DEEP_JSON}\n".encode()))
    with pytest.raises(DataError, match=r"data.jsonl.gz:2: JSON nested more than 64 levels deep"):
        _records(path)


def test_the_json_reader_bounds_size_and_depth_and_names_the_file(tmp_path: Path) -> None:
    from recipekit.runtime.boundary import jsonfile

    assert jsonfile.read(write(tmp_path / "ok.json", json.dumps({"a": nested(jsonfile.MAX_DEPTH - 1)}))) == {
        "a": nested(jsonfile.MAX_DEPTH - 1)
    }
    cases = {
        "deep.json": (DEEP_JSON, "deep.json: JSON nested more than 64 levels deep"),
        "deep65.json": (json.dumps(nested(65)), "deep65.json: JSON nested more than 64 levels deep"),
        "bytes.json": (b'{"a": "\xc3"}', "bytes.json: not UTF-8 text (byte 0xc3 at offset 7)"),
        "broken.json": ('{\n"a": }', "broken.json: not valid JSON (Expecting value at line 2 column 6)"),
        "digits.json": ("9" * 5000, "digits.json: not valid JSON (Exceeds the limit"),
    }
    for name, (content, message) in cases.items():
        with pytest.raises(jsonfile.UntrustedJSON) as raised:
            jsonfile.read(write(tmp_path / name, content))
        assert str(raised.value).startswith(f"{tmp_path / name}") and message in str(raised.value), name
        assert isinstance(raised.value, ValueError)
    with pytest.raises(jsonfile.UntrustedJSON, match="larger than 10 bytes"):
        jsonfile.read(write(tmp_path / "big.json", "[" + "1," * 10 + "1]"), max_bytes=10)
    assert jsonfile.nesting(nested(100_000)) == 100_000  # counted without recursion


@pytest.mark.parametrize(
    "content, expect",
    [(b"recipe: \xff\n", "is not UTF-8 text"), (DEEP_JSON.encode(), "")],
    ids=["not UTF-8", "100k deep"],
)
def test_the_runtime_reads_a_hostile_recipe_yaml_as_one_line(tmp_path: Path, content: bytes, expect: str) -> None:
    from recipekit.runtime.boundary.common import RunError
    from recipekit.runtime.boundary.config import load_run_config

    path = write(tmp_path / "recipe.yaml", content)
    with pytest.raises(RunError) as raised:
        load_run_config(path)
    assert str(path) in str(raised.value) and expect in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.slow
def test_data_prepare_refuses_a_data_line_nested_100k_deep(tmp_path: Path) -> None:
    """The whole path in real processes: the CLI, the bundle's prepare step and its workers; one line, exit 2."""
    pytest.importorskip("transformers")
    from recipekit.bundle.build import build

    root = tmp_path / "case"
    data = write(root / "data.jsonl", "\n".join([GOOD_LINE] * 20 + [DEEP_JSON]) + "\n")
    settings = [
        "recipe=tiny_sft",
        "cluster.nodes=1",
        "parallel=ddp",
        f"cluster.mount_path={root}",
        f"cluster.output_dir={root}/runs",
        f"data.path={data}",
    ]
    bundle = build(settings, output=tmp_path / "bundle", force=True).path
    (root / "work").mkdir()
    env = {**os.environ, "NO_COLOR": "1"}
    done = measure(["data", "prepare", str(bundle), "--workers", "1"], root / "work", env, 600)
    assert done.code == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"{data}:21: JSON nested more than 64 levels deep" in done.stderr.strip().splitlines()[-1]
    assert done.rss_mib < 2048, f"{done.rss_mib:.0f} MiB"


@pytest.mark.parametrize("name", ["ds_config.json", "launch.json", "plan.json", "grafana-dashboard.json"])
def test_validate_reports_a_bundle_json_nested_100k_deep_as_a_finding(
    name: str, tmp_path: Path, good_bundle: Path, good_validate_rss_mib: float
) -> None:
    """validate's documented refusal of a bad bundle: exit 1 with a finding naming the file (was a traceback)."""
    from recipekit.validate.shared.loader import rehash_manifest

    root = tmp_path / "case"
    (root / "work").mkdir(parents=True)
    bundle = copy(good_bundle, root, {name: DEEP_JSON})
    rehash_manifest(bundle)
    before = snapshot(root)
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    done = measure(["validate", str(bundle)], root / "work", env, MAX_WALL_S)
    assert done.code == 1 and "Traceback" not in done.stderr + done.stdout, done.stderr[-2000:]
    assert f"{name}: JSON nested more than 64 levels deep" in done.stdout
    assert snapshot(root) == before
    peak = good_validate_rss_mib + HOSTILE_FILE_HEADROOM_MIB
    assert done.wall_s < MAX_WALL_S and done.rss_mib < peak, (done.wall_s, done.rss_mib, good_validate_rss_mib)
