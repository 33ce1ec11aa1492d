"""Issue 38: `report` and `runs history` of a tampered bundle, and a run id holding terminal escapes.

A bundle whose manifest.json holds ``"versions": [1]`` or whose recipe.yaml holds ``plan: [1]`` (or ``recipe: [1]``)
ended both commands in an AttributeError traceback (exit 1): each is one line naming the file and the key now,
exit 2. A run id with terminal escapes (the run record a volume writer can change) never reaches the terminal raw.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from recipekit.bundle.build import build
from tests.unit.runfixtures import losses, write_run


@pytest.fixture(scope="module")
def bundle_and_volume(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tampered")
    bundle = build(["recipe=tiny_sft"], root / "bundle", force=True).path
    doc = yaml.safe_load((bundle / "recipe.yaml").read_text())
    output = Path(doc["training_arguments"]["output_dir"])
    volume = root / "volume"
    write_run(volume / output.relative_to(doc["recipe"]["cluster"]["mount_path"]), losses())
    return bundle, volume


def _manifest(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(bundle: Path) -> None:
        data = json.loads((bundle / "manifest.json").read_text())
        change(data)
        (bundle / "manifest.json").write_text(json.dumps(data))

    return apply


def _recipe(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(bundle: Path) -> None:
        data = yaml.safe_load((bundle / "recipe.yaml").read_text())
        change(data)
        (bundle / "recipe.yaml").write_text(yaml.safe_dump(data))

    return apply


TAMPERED = {
    "manifest versions [1]": (_manifest(lambda d: d.update(versions=[1])), "manifest.json", "versions"),
    "manifest recipe [1]": (_manifest(lambda d: d.update(recipe=[1])), "manifest.json", "recipe"),
    "recipe.yaml plan [1]": (_recipe(lambda d: d.update(plan=[1])), "recipe.yaml", "plan"),
    "recipe.yaml recipe [1]": (_recipe(lambda d: d.update(recipe=[1])), "recipe.yaml", "recipe"),
    "recipe.yaml cluster [1]": (_recipe(lambda d: d["recipe"].update(cluster=[1])), "recipe.yaml", "cluster"),
}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "recipekit.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_report_and_history_of_a_tampered_bundle_are_one_line(
    bundle_and_volume: tuple[Path, Path], tmp_path: Path, case: str
) -> None:
    source, volume = bundle_and_volume
    tamper, file, key = TAMPERED[case]
    bundle = Path(shutil.copytree(source, tmp_path / "bundle"))
    tamper(bundle)
    for args in (
        ["report", str(bundle), "--volume", str(volume), "-o", str(tmp_path / "out")],
        ["runs", "history", str(bundle)],
    ):
        proc = run_cli(*args)
        said = [line for line in proc.stderr.splitlines() if line.strip()]
        where = f"{case} {args[0]}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, where
        assert len(said) <= 2 and file in said[-1] and key in said[-1], where


def test_a_run_id_with_terminal_escapes_never_reaches_the_terminal_raw(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", losses())
    escapes = "\x1b]0;owned\x07\x1b[2J\x9b31m"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for record in records:  # the start record's run id and recipe name: printed in "What ran"
        if record.get("event") == "start":
            record.update(run_id="r" + escapes, recipe="tiny" + escapes)
    (run / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    record = {"run_id": "r" + escapes, "world_size": 1, "zero_stage": 2, "step": 4, "recipe": "tiny" + escapes}
    (run / "checkpoint-4").mkdir()
    (run / "checkpoint-4" / "recipekit-run.json").write_text(json.dumps(record))
    start = {"event": "start", "time": 1.0, "launch_time": 1.0, "world_size": 1, "resume_from": "x" + escapes,
             "interrupted": {"step": 3, "time": 0.5}}  # fmt: skip
    (run / "recovery.jsonl").write_text(json.dumps(start) + "\n")
    for args in (["report", str(run), "-o", str(tmp_path / "out")], ["compare", str(run), str(run)],
                 ["runs", "history", str(run)],
                 ["runs", "history", str(run), "--json"]):  # fmt: skip
        proc = run_cli(*args)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output[-2000:]
        assert not any(c in output for c in "\x1b\x07\x9b"), f"{args}: a raw escape reached the terminal"
