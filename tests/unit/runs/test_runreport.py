"""`recipekit report` and `recipekit compare` on synthetic run directories: reading, plan vs measured, restarts,
alignment verdicts, baselines, the files written and the escaping of foreign text. Fast: no training."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.cli import main
from recipekit.runs.compare import Tolerances, align, compare
from recipekit.runs.runlog import MAX_LINE_BYTES, from_records, load_run, on_volume, read_metrics
from recipekit.runs.runplan import DEFAULT_MARGIN, predictions, rows
from recipekit.runtime.boundary import filenames, flopcount
from tests.unit.runfixtures import PLAN, losses, write_plan, write_run

matplotlib = pytest.importorskip("matplotlib")


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


# ---------------------------------------------------------------------------------------------------- reading
def test_a_restart_is_read_with_its_interruption_downtime_and_recovery(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "out", losses(), kill_after=6, resume_step=4, downtime=30.0))
    assert [(a.resume_step, a.first_step, a.last_step) for a in run.attempts] == [(None, 1, 6), (4, 5, 8)]
    (restart,) = run.restarts
    assert restart.interrupted_at_step == 6 and restart.resumed_step == 4 and restart.replayed_steps == 2
    assert restart.downtime_s == pytest.approx(30.0)  # last record of attempt 0 → start of attempt 1
    # back past step 6 at step 7: 30 s down + steps 5, 6, 7 at one second each
    assert restart.recovery_s == pytest.approx(33.0)
    assert [s for s, _ in run.series["loss"]] == list(range(1, 9))  # a replayed step counted once
    assert [c["step"] for c in run.checkpoints] == [4, 8] and [c["seconds"] for c in run.checkpoints] == [0.2, 0.3]


def test_replayed_steps_keep_the_later_attempts_value() -> None:
    records = [
        {"event": "start", "resume_step": None},
        {"step": 1, "loss": 5.0},
        {"step": 2, "loss": 4.0},
        {"event": "start", "resume_step": 1},
        {"step": 2, "loss": 4.5},
    ]
    run = from_records("r", records)
    assert run.series["loss"] == [(1, 5.0), (2, 4.5)]
    assert run.restarts[0].downtime_s is None  # an older runtime wrote no times: nothing invented


def test_bad_long_and_non_object_lines_are_skipped_and_said(tmp_path: Path) -> None:
    long = '{"x": "' + "y" * MAX_LINE_BYTES + '"}'
    out = write_run(tmp_path / "out", losses(), extra_lines=["{not json", "[1, 2]", long])
    records, warnings = read_metrics(out / filenames.METRICS_FILE)
    assert records and all(isinstance(r, dict) for r in records)
    (said,) = [w for w in warnings if "skipped" in w]
    assert "3 line(s) skipped" in said and "not valid JSON" in said  # the first one's reason


def test_non_finite_and_boolean_values_are_not_plotted() -> None:
    run = from_records("r", [{"step": 1, "loss": float("nan"), "grad_norm": True}, {"step": 2, "loss": 3.0}])
    assert run.series == {"loss": [(2, 3.0)]}


def test_a_bundle_finds_its_output_directory_below_the_volume(tmp_path: Path) -> None:
    from recipekit.bundle.build import build

    bundle = build(["recipe=tiny_sft"], tmp_path / "bundle", force=True).path
    import yaml

    output = yaml.safe_load((bundle / "recipe.yaml").read_text())["training_arguments"]["output_dir"]
    mount = yaml.safe_load((bundle / "recipe.yaml").read_text())["recipe"]["cluster"]["mount_path"]
    volume = tmp_path / "pvc"
    write_run(on_volume(output, mount, volume), losses())
    run = load_run(bundle, volume)
    assert run.plan is not None and run.plan["recipe"] == "tiny_sft"
    assert run.recipe["name"] == "tiny_sft" and run.recipe_digest and len(run.recipe_digest) == 64
    assert run.output_dir == volume / output[len(mount) :].lstrip("/")
    result = invoke("report", bundle, "-o", tmp_path / "r", "--json")  # without --volume: not on this machine
    assert result.exit_code == 2 and "--volume" in result.output and "Traceback" not in result.output


# ------------------------------------------------------------------------------------------------ plan vs run
def test_predictions_follow_the_plans_arithmetic() -> None:
    p = predictions(PLAN)
    assert p["step_time_s"] == 0.5
    assert p["tokens_per_second_per_device"] == pytest.approx(1024 / 0.5 / 2)
    assert p["mfu"] == pytest.approx(flopcount.utilisation(1024.0, 1e9, 10.0))
    assert p["hfu"] == pytest.approx(p["mfu"] * 1.5)
    assert predictions(None)["step_time_s"] is None


def test_measured_figures_are_held_against_the_plan_with_ratios(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "out", losses()), plan=write_plan(tmp_path / "plan.json"))
    table = {r.key: r for r in rows(run)}
    assert table["step_time_s"].ratio == pytest.approx(0.55 / 0.5)
    assert table["tokens_per_second_per_device"].ratio == pytest.approx(1000 / 1024)
    assert not table["step_time_s"].deviates(DEFAULT_MARGIN) and table["step_time_s"].deviates(0.05)
    assert table["memory_gib"].measured is None and "no peak" in table["memory_gib"].note


# ------------------------------------------------------------------------------------------------------ compare
def test_identical_runs_align_and_a_drift_names_its_first_step(tmp_path: Path) -> None:
    base = losses()
    drifted = [v * (1.0 if i < 4 else 1.08) for i, v in enumerate(base)]  # 8 % from step 5 on
    a = load_run(write_run(tmp_path / "a", base))
    assert compare(a, load_run(write_run(tmp_path / "b", base))).aligned
    result = compare(a, load_run(write_run(tmp_path / "c", drifted)), Tolerances(loss_rtol=0.02, window=3))
    assert not result.aligned and result.loss.first_divergence == 5  # window 3-5: mean 2.7 % > 2 %
    assert "loss diverges at step 5" in result.reasons[0]


def test_one_noisy_step_inside_a_window_does_not_fail_a_run() -> None:
    a = [(s, 6.0) for s in range(1, 9)]
    b = [(s, 6.0 * (1.05 if s == 5 else 1.0)) for s in range(1, 9)]  # one step 5 % off
    assert align("loss", a, b, 0.02, 3).first_divergence is None
    assert align("loss", a, b, 0.02, 1).first_divergence == 5
    # fewer common steps than the window: judged once, on everything there is
    assert align("loss", a[:2], [(1, 7.0), (2, 7.0)], 0.02, 3).first_divergence == 2


def test_eval_loss_and_grad_norm_decide_too(tmp_path: Path) -> None:
    a = load_run(write_run(tmp_path / "a", losses(), evals={4: 5.5, 8: 5.2}))
    b = load_run(write_run(tmp_path / "b", losses(), evals={4: 5.5, 8: 5.9}))
    result = compare(a, b)
    assert not result.aligned and result.eval_loss.first_divergence == 8 and result.loss.aligned


def test_compare_names_the_recipe_keys_that_differ_with_diffs_cause_list(tmp_path: Path) -> None:
    a = load_run(write_run(tmp_path / "a", losses()))
    b = load_run(write_run(tmp_path / "b", losses()))
    a.manifest = {"recipe": {"train": {"learning_rate": 1e-3, "seed": 42}}, "versions": {"torch": "2.13.0"}}
    b.manifest = {"recipe": {"train": {"learning_rate": 1e-2, "seed": 42}}, "versions": {"torch": "2.12.0"}}
    result = compare(a, b)
    assert result.recipe_changes == ["train.learning_rate: 0.001 → 0.01"]
    assert result.version_changes == ["torch: 2.13.0 → 2.12.0"]


def test_compare_cli_exit_codes_json_and_html(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", losses())
    b = write_run(tmp_path / "b", [v * 1.1 for v in losses()])
    same = invoke("compare", a, a, "--json")
    assert same.exit_code == 0 and json.loads(same.stdout)["aligned"] is True
    off = invoke("compare", a, b, "--html", tmp_path / "cmp")
    assert off.exit_code == 1 and "NOT ALIGNED" in off.output and "loss diverges at step 3" in off.output
    html = (tmp_path / "cmp" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4 and "Loss: both runs" in html  # no eval loss logged
    # within a 20 % tolerance, but the loss moved 6 % in all: no difference that large could have shown
    loose = invoke("compare", a, b, "--loss-rtol", "0.2", "--grad-norm-rtol", "1")
    assert loose.exit_code == 3 and "INCONCLUSIVE" in loose.output and "the loss moved" in loose.output


def test_a_baseline_file_gates_a_run(tmp_path: Path) -> None:
    out = write_run(tmp_path / "a", losses())
    base = tmp_path / "baseline.json"
    result = invoke("report", out, "-o", tmp_path / "r", "--export-baseline", base, "--json")
    assert result.exit_code == 0, result.output
    assert base.stat().st_size < 20_000 and json.loads(base.read_text())["format"] == "recipekit-baseline/1"
    assert invoke("compare", out, "--baseline", base).exit_code == 0
    worse = write_run(tmp_path / "worse", [v * 1.05 for v in losses()])
    gate = invoke("compare", worse, "--baseline", base, "--json")
    assert gate.exit_code == 1 and json.loads(gate.stdout)["loss"]["first_divergence"] == 3
    assert invoke("compare", out, worse, "--baseline", base).exit_code == 2  # one RUN with --baseline


@pytest.mark.parametrize(
    "args, message",
    [
        (["report", "{tmp}/nowhere"], "no such run directory"),
        (["report", "{tmp}"], "neither a run's output directory"),
        (["compare", "{tmp}/nowhere"], "give two runs"),
        (["compare", "{tmp}/bad.json", "{tmp}/bad.json"], "not a baseline file"),
    ],
)
def test_unusable_input_exits_2_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    result = invoke(*(a.format(tmp=tmp_path) for a in args))
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


# ------------------------------------------------------------------------------------------------------- report
def test_report_writes_a_self_contained_page_pngs_and_json(tmp_path: Path) -> None:
    out = write_run(tmp_path / "out", losses(), kill_after=6, evals={4: 5.9, 8: 5.7})
    result = invoke("report", out, "--plan", write_plan(tmp_path / "plan.json"), "-o", tmp_path / "r", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    names = {Path(f).name for f in doc["files"]}
    expected = {"loss", "learning_rate", "grad_norm", "tokens_per_second", "utilisation", "step_time", "checkpoints"}
    assert {f"{n}.png" for n in expected | {"restarts", "preflight_bandwidth"}} <= names
    html = (tmp_path / "r" / "report.html").read_text()
    assert html.count("<img ") == html.count("data:image/png;base64,") == len([n for n in names if n.endswith(".png")])
    assert "http://" not in html and "https://" not in html and "<script" not in html  # opens offline
    assert "Interruptions and recovery" in html and "Plan vs measured" in html
    (restart,) = doc["restarts"]
    assert restart["interrupted_at_step"] == 6 and restart["resumed_step"] == 4 and restart["recovery_s"] == 33.0
    plan = {r["key"]: r for r in doc["plan"]}
    assert plan["step_time_s"]["ratio"] == pytest.approx(1.1) and plan["step_time_s"]["deviates"] is False


def test_the_plots_are_deterministic(tmp_path: Path) -> None:
    from recipekit.runs.runplots import run_plots

    run = load_run(write_run(tmp_path / "out", losses(), kill_after=6), plan=write_plan(tmp_path / "plan.json"))
    first, second = run_plots(run), run_plots(run)
    assert [p.png for p in first] == [p.png for p in second]
    assert all(p.png.startswith(b"\x89PNG") for p in first) and all(p.title for p in first)
    assert all(b"Software" not in p.png and b"Creation Time" not in p.png for p in first)


def test_foreign_text_is_escaped_in_the_page_and_the_terminal(tmp_path: Path) -> None:
    out = write_run(tmp_path / "run<script>[bold red]x", losses())
    result = invoke("report", out, "-o", tmp_path / "r")
    assert result.exit_code == 0, result.output
    assert "run<script>[bold red]x" in result.output  # printed as it is, not read as rich markup
    html = (tmp_path / "r" / "report.html").read_text()
    assert "run&lt;script&gt;[bold red]x" in html and "<script>" not in html


def test_a_run_without_a_plan_says_so(tmp_path: Path) -> None:
    result = invoke("report", write_run(tmp_path / "out", losses()), "-o", tmp_path / "r", "--json")
    doc = json.loads(result.stdout)
    assert "no plan.json" in " ".join(doc["warnings"]) and doc["deviations"] == []
    assert all(r["predicted"] is None for r in doc["plan"])
    assert not math.isnan(doc["plan"][0]["measured"])


def test_a_hostile_recipe_yaml_is_refused_in_one_line(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text("{}")
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
    )
    (bundle / "recipe.yaml").write_text(bomb)
    result = invoke("report", bundle, "-o", tmp_path / "r")
    assert result.exit_code == 2 and "recipe.yaml" in result.output and "Traceback" not in result.output
