"""``recipekit compare`` of three or more runs (runs/sweep.py, cli/sweeps/compare.py): one row each, the swept recipe
keys found, the best (lowest final loss) marked, overlaid curves in one HTML report; two runs keep their alignment
verdict. A real 4-run sweep, dry-run and opened in a browser: tests/integration/test_sweep_runs.py."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from recipekit.cli import main
from recipekit.runs.runlog import RunLog
from recipekit.runs.sweep import final_loss, sweep_rows, swept_keys
from tests.unit.runfixtures import losses, write_run


def _sweep(tmp_path: Path, slopes: tuple[float, ...] = (0.01, 0.05, 0.1, 0.03)) -> list[str]:
    return [str(write_run(tmp_path / f"lr{i}", losses(8, slope=s))) for i, s in enumerate(slopes)]


def test_four_runs_give_a_table_with_the_best_marked_and_an_html_report(tmp_path: Path) -> None:
    runs = _sweep(tmp_path)
    result = CliRunner().invoke(main, ["compare", *runs, "--html", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert "4 runs side by side" in result.output and "best: run 3 (lowest final loss)" in result.output
    paths = ("1:", "2:", "3:", "4:", "comparison:")  # the run paths go on their own lines
    table = [line for line in result.output.splitlines() if not line.startswith(paths)]
    assert "3 best" in result.output and all(len(line) <= 80 for line in table)
    html = (tmp_path / "r" / "report.html").read_text()
    assert "Sweep: 4 runs" in html and "★ best" in html and html.count("<tr>") == 5
    assert sorted(p.name for p in (tmp_path / "r").glob("*.png")) == [
        "sweep_loss.png",
        "sweep_tokens_per_second_per_device.png",
    ]
    document = json.loads(CliRunner().invoke(main, ["compare", *runs, "--json"]).output)
    assert document["kind"] == "sweep" and document["best"] == runs[2]
    assert [r["final_step"] for r in document["runs"]] == [8, 8, 8, 8]
    assert abs(document["runs"][2]["final_loss"] - (5.5 + 5.4 + 5.3) / 3) < 1e-9


def test_two_runs_keep_the_alignment_verdict(tmp_path: Path) -> None:
    runs = _sweep(tmp_path, (0.05, 0.05))
    result = CliRunner().invoke(main, ["compare", *runs])
    assert result.exit_code == 0 and "ALIGNED" in result.output and "side by side" not in result.output


def test_a_run_without_a_loss_is_never_best_and_none_at_all_cannot_rank(tmp_path: Path) -> None:
    rows = sweep_rows([RunLog("a", series={"loss": [(1, 3.0)]}), RunLog("b"), RunLog("c", series={"loss": [(1, 2.0)]})])
    assert [r.best for r in rows] == [False, False, True] and rows[1].final_loss is None
    empty = [str(write_run(tmp_path / f"e{i}", [])) for i in range(3)]
    result = CliRunner().invoke(main, ["compare", *empty])
    assert result.exit_code == 3 and "nothing to rank" in result.output


def test_the_swept_keys_are_those_whose_values_differ() -> None:
    def run(label: str, lr: float, seed: int) -> RunLog:
        recipe = {"name": label, "train": {"learning_rate": lr, "seed": seed, "max_steps": 8}}
        return RunLog(label, manifest={"recipe": recipe}, series={"loss": [(1, 2.0), (2, 1.0 + lr)]})

    runs = [run("a", 1e-4, 1), run("b", 3e-4, 1), run("c", 3e-4, 2)]
    assert swept_keys(runs) == ["train.learning_rate", "train.seed"]
    assert [r.swept for r in sweep_rows(runs)][0] == "train.learning_rate=0.0001, train.seed=1"
    assert final_loss(runs[0], 1) == 1.0001


def test_a_matrix_root_expands_to_its_bundles_runs(tmp_path: Path) -> None:
    built = CliRunner().invoke(
        main, ["build", "-m", "recipe=tiny_sft", "train.learning_rate=1e-4,1e-3", "-o", str(tmp_path / "sweep")]
    )
    assert built.exit_code == 0, built.output
    for bundle in (tmp_path / "sweep").iterdir():  # each bundle's output directory, as if a volume held it
        output = json.loads((bundle / "manifest.json").read_text())["recipe"]["cluster"]["output_dir"]
        assert output.startswith("/mnt/shared")
    result = CliRunner().invoke(main, ["compare", str(tmp_path / "sweep")])
    assert result.exit_code == 2 and "/mnt/shared" in result.output  # the runs are on the cluster's volume
