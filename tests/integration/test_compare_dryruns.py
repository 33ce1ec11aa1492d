"""`recipekit report` and `compare` on real CPU dry runs of tiny_sft (two simulated pods, ZeRO-2, 8 steps).

Four dry runs, shared by every test of this module (about 1-2 minutes each on 2 cores): one whose pod 1 is killed at
step 6 and resumes from checkpoint-4, one clean run of the same recipe and seed, one with the learning rate ×10 and
one with another seed. The killed run is the reference: its final curve (the replayed steps as trained the second
time) must align with the clean run's, which also shows that a resume loses nothing. The killed run is also judged
as test_dryrun judges a kill, and `recipekit runs history` of it must print the MTTR the dry run reported. Slow:
deselect with ``-m 'not slow'``.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from recipekit.bundle.build import build
from recipekit.cli import main
from recipekit.runtime.boundary import filenames
from recipekit.validate.dryrun.options import DryRunOptions
from recipekit.validate.dryrun.run import run_dry_run
from recipekit.validate.shared.loader import load_bundle
from recipekit.validate.shared.results import Status
from tests.integration.test_dryrun import assert_killed_and_resumed, kill_and_resume

pytestmark = pytest.mark.slow

_MISSING = [m for m in ("torch", "transformers", "deepspeed", "matplotlib") if importlib.util.find_spec(m) is None]
if _MISSING:
    pytest.skip(f"the training stack or matplotlib is not installed ({', '.join(_MISSING)})", allow_module_level=True)

TIMEOUT_S = 420
#: The runs beside the killed one (its own fixture), by name: their overrides of tiny_sft.
RUNS = {
    "same": [],
    "lr10": ["train.learning_rate=1e-2"],  # tiny_sft's 1e-3 × 10
    "seed": ["train.seed=7"],
}


@dataclass(frozen=True)
class Killed:
    """The killed run as `validate` reported it (its --json on stdout, progress on stderr), its bundle and its work
    directory."""

    result: Result
    bundle: Path
    workdir: Path


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Killed:
    """The killed run, through the CLI as test_dryrun kills a pod, so that it judges this run too."""
    root = tmp_path_factory.mktemp("killed")
    bundle, workdir = build(["recipe=tiny_sft"], root / "bundle", force=True).path, root / "work"
    return Killed(kill_and_resume(bundle, workdir, victim=1), bundle, workdir)


def test_the_killed_run_resumed_from_its_checkpoint(killed: Killed) -> None:
    """Pod 1 of a ZeRO-2 bundle (test_dryrun kills pod 0 of a ZeRO-3 one)."""
    assert_killed_and_resumed(killed.result, killed.bundle, killed.workdir, victim=1)


def test_runs_history_prints_the_dry_runs_mttr_for_the_same_kill(killed: Killed) -> None:
    """MTTR measured in production equals the dry run's: the restarted run recorded the recovery in its output
    directory, and `recipekit runs history` prints the MTTR the dry run's judge reported."""
    resume = {c["id"]: c for c in json.loads(killed.result.stdout)["checks"]}["dryrun.resume"]["details"]
    recipe = yaml.safe_load((killed.workdir / "bundle" / filenames.RECIPE_FILE).read_text())
    printed = invoke("runs", "history", recipe["training_arguments"]["output_dir"], "--json")
    assert printed.exit_code == 0, printed.output
    history = json.loads(printed.output)
    assert history["restarts"] == 1
    assert history["last_mttr_s"] == resume["mttr_s"] > 0
    recovered = history["recoveries"][0]
    assert recovered["resume_step"] == resume["resumed_step"] == 4
    assert recovered["interrupted_step"] >= 6 and recovered["steps_lost"] == recovered["interrupted_step"] - 4
    assert recovered["first_step"] == 5
    # why the attempt ended: the killed pod left no record (its processes were SIGKILLed); the Job restarted
    assert recovered["ended"].startswith("pod(s) 1 (rank(s) 1) left no record: killed outright")
    assert recovered["ended"].endswith("the Job: RestartJob (PodFailed)")
    # the dry run's own observation (kill → first step seen) agrees within the time it takes to notice a step
    assert abs(resume["mttr_observed_s"] - resume["mttr_s"]) < 2.0


@pytest.fixture(scope="module")
def runs(killed: Killed, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    # what this module needs of a run: it trained to the end (the killed one: and resumed). The other checks (the
    # metrics endpoint's scrape, say) are test_dryrun's and test_dryrun_ops's to judge.
    assert killed.result.exit_code == 0, killed.result.stdout[-4000:]
    root = tmp_path_factory.mktemp("runs")
    found = {"killed": killed.workdir}
    for name, overrides in RUNS.items():
        bundle = build(["recipe=tiny_sft", *overrides], root / f"bundle-{name}", force=True).path
        options = DryRunOptions(pods=2, workdir=root / name, timeout=TIMEOUT_S)
        train = next(r for r in run_dry_run(load_bundle(bundle), options) if r.id == "dryrun.train")
        assert train.status is Status.PASS, f"{train.reason} {[str(f) for f in train.findings]}"
        found[name] = root / name
    return found


def invoke(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_the_same_recipe_and_seed_align(runs: dict[str, Path], tmp_path: Path) -> None:
    result = invoke("compare", runs["killed"], runs["same"], "--json", "--html", tmp_path / "cmp")
    doc = json.loads(result.stdout)
    assert result.exit_code == 0 and doc["aligned"], doc["reasons"]
    assert len(doc["loss"]["steps"]) == 8 and doc["loss"]["max_abs_diff"] < 1e-3
    assert doc["recipe_changes"] == []  # the dry runs' own work directories are no difference
    assert (tmp_path / "cmp" / "compare_loss.png").is_file()


def test_the_learning_rate_times_ten_fails_naming_the_first_diverging_step(runs: dict[str, Path]) -> None:
    result = invoke("compare", runs["same"], runs["lr10"])
    assert result.exit_code == 1, result.output
    assert "loss diverges at step 4" in result.output and "NOT ALIGNED" in result.output
    assert "recipe: train.learning_rate: 0.001 → 0.01" in result.output


def test_another_seed_stays_within_the_default_tolerance(runs: dict[str, Path]) -> None:
    """Different weights and batches: steps differ by several percent, the 3-step windows by less than 2 %
    (docs/reports.md has the measurement)."""
    result = invoke("compare", runs["same"], runs["seed"], "--json")
    doc = json.loads(result.stdout)
    assert result.exit_code == 0, doc["reasons"]
    assert doc["loss"]["max_rel_diff"] > 0.02 > doc["loss"]["max_window_rel_diff"]
    assert doc["recipe_changes"] == ["train.seed: 42 → 7"]


def test_plan_vs_measured_uses_the_twins_own_plan(runs: dict[str, Path], tmp_path: Path) -> None:
    result = invoke("report", runs["same"], "-o", tmp_path / "r", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    plan = json.loads((runs["same"] / "bundle" / "plan.json").read_text())  # the dry run's re-planned twin
    rows = {r["key"]: r for r in doc["plan"]}
    step, tokens = rows["step_time_s"], rows["tokens_per_second_per_device"]
    assert step["predicted"] == plan["time"]["step_s"]
    world = plan["layout"]["world_size"]
    assert tokens["predicted"] == pytest.approx(plan["compute"]["tokens_per_step"] / plan["time"]["step_s"] / world)
    for row in (step, tokens):
        assert row["measured"] > 0 and row["ratio"] == pytest.approx(row["measured"] / row["predicted"])
    # memory: the plan's per device beside the measured peak (a CPU run's is the process's peak RSS), with the ratio
    memory = rows["memory_gib"]
    assert memory["predicted"] == plan["memory_gib"]["total"] and memory["measured"] > 0 and "RSS" in memory["note"]
    assert memory["ratio"] == pytest.approx(memory["measured"] / memory["predicted"]) and not memory["deviates"]


def test_the_report_of_a_killed_run_shows_the_interruption_and_recovery(runs: dict[str, Path], tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    result = invoke("report", runs["killed"], "-o", tmp_path / "r", "--json", "--export-baseline", baseline)
    assert result.exit_code == 0, result.output
    (restart,) = json.loads(result.stdout)["restarts"]
    assert restart["interrupted_at_step"] >= 6 and restart["resumed_step"] == 4
    assert restart["recovery_s"] > restart["downtime_s"] > 0
    html = (tmp_path / "r" / "report.html").read_text()
    assert "Interruptions and recovery" in html and (tmp_path / "r" / "restarts.png").is_file()
    # the regression gate on real numbers: the clean run against the killed run's baseline
    assert invoke("compare", runs["same"], "--baseline", baseline).exit_code == 0
    assert invoke("compare", runs["lr10"], "--baseline", baseline).exit_code == 1
