"""`recipekit validate --dry-run`: real bundles run as two simulated Volcano pods on this CPU.

Each case builds a preset bundle with ``bundle.build`` and dry-runs it: the bundle's own run.sh starts torchrun
in each pod, train.py trains the tiny twin with the real Trainer (DeepSpeed ZeRO-2/3 or DDP, gloo), checkpoints
midway and at the end. The kill case SIGKILLs one pod's whole process tree mid-run and checks the restarted job
resumes from the last complete checkpoint. What train.py did is read from its structured records in metrics.jsonl
(start, adapted, done), so these expectations need a train.py that writes them. Slow (about 4-5 minutes on 2 cores
once DeepSpeed's op is built): deselect with ``-m 'not slow'``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import psutil
import pytest
import yaml
from click.testing import CliRunner, Result

from recipekit.bundle.build import build
from recipekit.cli.validate import validate_command
from recipekit.validate.dryrun.options import DryRunOptions
from recipekit.validate.dryrun.run import run_dry_run
from recipekit.validate.shared.loader import load_bundle
from recipekit.validate.shared.results import Status

pytestmark = pytest.mark.slow

_MISSING = [
    m for m in ("torch", "transformers", "deepspeed", "peft", "datasets") if importlib.util.find_spec(m) is None
]
if _MISSING:
    pytest.skip(f"the training stack is not installed ({', '.join(_MISSING)})", allow_module_level=True)

TIMEOUT_S = 420
#: Each case's overrides. The README's own dry run (Llama 3 8B SFT, ZeRO-3 on one 8-device node) is judged by
#: :func:`assert_trains_checkpoints_and_finishes` too, in test_compare_presets.py, which runs it as pasted.
CASES = {
    "ddp": ["recipe=tiny_sft", "parallel=ddp"],
    "zero3": ["recipe=qwen2.5_14b_sft"],  # 2 nodes × 8 NPUs, ZeRO-3, the Qwen2 twin
    "lora": ["recipe=llama3_8b_lora"],  # LoRA on ZeRO-2, one 8-device node in the bundle, two 1-process pods here
}


def processes_under(path: Path) -> list[int]:
    """Processes whose command line or environment mentions ``path`` (a dry run's leftovers: every pod's process
    tree inherits the run key's path in the work directory, and torchrun's workers read the launcher's checked copy
    of the run files, outside it)."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(str(path) in part for part in process.info["cmdline"] or []) or any(
                str(path) in value for value in process.environ().values()
            ):
                found.append(process.info["pid"])
        except (psutil.Error, TypeError):
            continue
    return found


def _explain(results) -> str:
    lines = []
    for r in results:
        lines.append(f"{r.id}: {r.status.value} {r.reason} {[str(f) for f in r.findings]}")
        for name, tail in (r.details.get("log_tails") or {}).items():
            lines.append(f"--- {name}\n{tail}")
    return "\n".join(lines)


@pytest.mark.parametrize("case", sorted(CASES))
def test_dry_run_trains_checkpoints_and_finishes(tmp_path: Path, case: str) -> None:
    bundle = build(CASES[case], tmp_path / "bundle", force=True).path
    workdir = tmp_path / "work"
    ran = run_dry_run(load_bundle(bundle), DryRunOptions(pods=2, workdir=workdir, timeout=TIMEOUT_S))
    assert all(r.status is not Status.FAIL for r in ran), _explain(ran)
    assert_trains_checkpoints_and_finishes(bundle, workdir, zero3=case == "zero3", one_node_of_8=case == "lora")


def reported(workdir: Path) -> dict[str, dict]:
    """Each check of the dry run kept in ``workdir``, by id, as its report.json holds it (what --json prints)."""
    return {r["id"]: r for r in json.loads((workdir / "report.json").read_text())}


def assert_trains_checkpoints_and_finishes(bundle: Path, workdir: Path, *, zero3: bool, one_node_of_8: bool) -> None:
    """A default dry run of ``bundle`` in ``workdir``, by its report: 8 steps on two pods, checkpoints at 4 and 8, the
    data prepared by both pods, nothing left running. ``zero3``: ZeRO-3's settings were scaled to the twin;
    ``one_node_of_8``: the bundle's one 8-device node became two 1-process pods."""
    results = reported(workdir)
    assert all(r["status"] != Status.FAIL.value for r in results.values()), json.dumps(results)[-6000:]
    train = results["dryrun.train"]
    assert train["status"] == Status.PASS.value
    details = train["details"]
    assert details["exit_codes"] == {"0": 0, "1": 0}
    assert details["final_step"] == 8 and details["checkpoints"][-2:] == [4, 8]
    assert details["final_weights"], "no final model written"
    assert details["time_to_first_step_s"] > 0 and details["steps_per_s"] > 0
    # train.py's own account, from its structured records in metrics.jsonl (no log text is read).
    assert details["started"]["world_size"] == 2 and details["started"]["resume_from"] is None
    assert details["done"]["step"] == 8
    assert isinstance(details["first_loss"], float) and isinstance(details["final_loss"], float)
    # The data was prepared inside the pods, before their process group formed: both pods took a share.
    data = details["data"]
    assert data["workers"] == 2 and data["chunks"] >= 4 and not data["reused"] and data["train_rows"] > 0
    prepared = Path(data["directory"])
    assert prepared.parent == workdir / "shared" / "runs" / "prepared" and (prepared / "manifest.json").is_file()
    shares = [json.loads((prepared / "progress" / f"{pod}.json").read_text())["chunks"] for pod in (0, 1)]
    assert min(shares) >= 2 and sum(shares) == data["chunks"]
    # The bundle itself is untouched; every process is gone.
    assert not (bundle / "shared").exists() and (workdir / "substitutions.json").is_file()
    assert processes_under(workdir) == []
    subs = {s["field"] for s in results["dryrun.prepare"]["details"]["substitutions"]}
    assert "training_arguments.output_dir" in subs
    if zero3:
        assert "zero_optimization.stage3_param_persistence_threshold" in subs
    if one_node_of_8:
        assert {"plan.world_size", "nodes", "nproc_per_node", "train_batch_size", "recipe.hw"} <= subs


def test_kill_the_master_pod_and_resume_from_the_checkpoint(tmp_path: Path) -> None:
    """Pod 0 (the rendezvous host and rank 0) of a ZeRO-3 bundle, whose checkpoint holds partitioned optimizer and
    parameter state. (Pod 1 of a ZeRO-2 bundle: test_compare_dryruns' killed run, judged the same way.)"""
    bundle = build(["recipe=llama3_8b_sft"], tmp_path / "bundle", force=True).path
    result = kill_and_resume(bundle, tmp_path / "work", victim=0)
    assert_killed_and_resumed(result, bundle, tmp_path / "work", victim=0)


def kill_and_resume(bundle: Path, workdir: Path, *, victim: int) -> Result:
    """Through the CLI, with --json: pod ``victim`` dies at step 6, the job restarts (and should resume at
    checkpoint-4)."""
    argv = ["--pods", "2", "--kill-pod", str(victim), "--at-step", "6", "--workdir", str(workdir)]
    return CliRunner().invoke(
        validate_command, [str(bundle), "--dry-run", *argv, "--timeout", str(TIMEOUT_S), "--json"]
    )


def assert_killed_and_resumed(result: Result, bundle: Path, workdir: Path, *, victim: int) -> None:
    """What :func:`kill_and_resume` must show: the kill at step 6, the restart from checkpoint-4 row by row, every
    phase reported once per pod and attempt, the data prepared once."""
    document = json.loads(result.stdout)
    checks = {c["id"]: c for c in document["checks"]}
    assert result.exit_code == 0, json.dumps({k: checks[k] for k in checks if k.startswith("dryrun")}, indent=1)
    resume = checks["dryrun.resume"]["details"]
    assert resume["killed_pod"] == victim and resume["killed_at_step"] == 6  # the pods hold at 6 until the kill
    assert resume["killed_processes"] >= 2  # torchrun and its worker, which lives in a session of its own
    assert resume["complete_checkpoints_at_restart"] == [4] and resume["expected_resume_step"] == 4
    assert resume["resumed_step"] == 4 and resume["first_step_after_restart"] == 5  # from the restart's start record
    assert resume["resumed_from"].endswith("checkpoint-4")
    assert resume["rows_checked_steps"] == list(range(1, 9))  # the row ledger: every step took its rows, once
    assert resume["mttr_s"] > 0 and resume["exit_codes"] == {"0": 0, "1": 0}
    assert resume["replayed_loss_max_abs_diff"] < 1e-3  # steps 5-6 trained twice from the same state
    assert "replayed steps' loss differs by" in checks["dryrun.resume"]["reason"]
    train = checks["dryrun.train"]["details"]
    assert train["final_step"] == 8 and train["checkpoints"][-1] == 8
    assert processes_under(workdir) == []
    # Every pod ran from its run files as the Job mounts them: the ConfigMap's data, read-only, at run/ beside the
    # runtime (the image's content); the launcher checked them against the Job's digest before starting.
    names = set(yaml.safe_load((bundle / "run-files.yaml").read_text())["data"])
    for pod in (0, 1):
        mounted = workdir / "pods" / f"pod-{pod}" / "run"
        assert {p.name for p in mounted.iterdir()} == names and not mounted.stat().st_mode & 0o222
    # Each phase was reported as it happened, once per pod and attempt: the launcher, torchrun, train.py's start.
    for attempt in (0, 1):
        for pod in (0, 1):
            assert f"attempt {attempt}: pod {pod}: launch: pod {pod}/2" in result.stderr, result.stderr
            assert f"attempt {attempt}: pod {pod}: torchrun started 1 worker" in result.stderr, result.stderr
    assert "attempt 1: train.py started: world size 2" in result.stderr and "resuming from" in result.stderr
    # The pods prepared the data in the first attempt; the restart found it and prepared nothing.
    assert "attempt 0: train.py prepared the data over 2 worker(s)" in result.stderr
    assert "attempt 1: train.py reused prepared data" in result.stderr
    assert train["data"]["reused"] is False and resume["data"]["reused"] is True
    assert resume["data"]["fingerprint"] == train["data"]["fingerprint"]


def test_a_run_past_its_timeout_is_stopped_and_cleaned_up(tmp_path: Path) -> None:
    """A run longer than its timeout (10,000 steps in 10 s; a pod waiting on a peer forever is the case in the
    field): the dry run's timeout kills every pod and reports a failure."""
    bundle = build(["recipe=tiny_sft", "parallel=ddp"], tmp_path / "bundle", force=True).path
    workdir = tmp_path / "work"
    result = CliRunner().invoke(
        validate_command, [str(bundle), "--dry-run", "--steps", "10000", "--workdir", str(workdir), "--timeout", "10"]
    )
    assert result.exit_code == 1, result.output
    assert "dryrun.train" in result.stdout and "--timeout 10" in result.stdout
    assert processes_under(workdir) == []
    assert (workdir / "logs" / "pod-0.log").is_file()  # the logs stay for a look


def test_a_device_that_is_not_here_is_skipped_with_a_reason(tmp_path: Path) -> None:
    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu is installed here")
    bundle = build(["recipe=tiny_sft"], tmp_path / "bundle", force=True).path
    results = run_dry_run(load_bundle(bundle), DryRunOptions(device="npu", workdir=tmp_path / "work"))
    assert {r.status for r in results} == {Status.SKIP}
    assert all("npu" in r.reason for r in results), [r.reason for r in results]
    assert not (tmp_path / "work").exists()


def test_each_dry_run_keeps_its_work_directory_and_the_bundle_s_run_id(tmp_path: Path, monkeypatch) -> None:
    """Issue 41: the default work directory was replaced by the next dry run of the bundle, and the dry run's run id
    differed from the bundle's (924d0f vs 18553a). Now each dry run works in <bundle>/../.dryrun/<name>/<run id>-<time>
    (an older one stays), and the bundle, the dry run's records and its report carry one run id."""
    from recipekit.cli import main

    monkeypatch.chdir(tmp_path)
    built = build(["recipe=tiny_sft", "parallel=ddp"], tmp_path / "bundles" / "tiny_sft")
    run_id = built.resolved.plan.run_id
    kept = tmp_path / "bundles" / ".dryrun" / "tiny_sft"
    older = kept / f"{run_id}-20000101-000000"
    (older / "logs").mkdir(parents=True)
    (older / ".recipekit-dryrun").write_text("")
    result = CliRunner().invoke(validate_command, ["bundles/tiny_sft", "--dry-run", "--steps", "4"])
    assert result.exit_code == 0, result.output
    assert older.is_dir(), "an older dry run of the bundle is kept"
    [new] = [p for p in kept.iterdir() if p != older]
    assert new.name.startswith(f"{run_id}-") and "dry run kept in" in result.output
    start = next(
        json.loads(line)
        for line in (new / "shared").rglob("metrics.jsonl").__next__().read_text().splitlines()
        if '"event": "start"' in line
    )
    assert start["run_id"] == run_id, "the dry run's records carry the bundle's run id"
    report = CliRunner().invoke(main, ["report", "bundles/.dryrun/tiny_sft", "--json"])
    assert report.exit_code == 0, report.output
    assert dict(json.loads(report.stdout)["what_ran"])["run id"] == run_id
    assert (tmp_path / "recipekit-report").is_dir() and next((tmp_path / "recipekit-report").iterdir()).name.startswith(
        f"{run_id}-"
    )
