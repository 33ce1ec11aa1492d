"""Exit codes as the contract between the run and Volcano: one table, the pod exits with the run's own code, and the
Job's policies (checked by the webhook rules and the simulated controller) act on it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from recipekit.bundle.build import build
from recipekit.runtime import launch
from recipekit.runtime.boundary import exitcodes
from recipekit.validate.shared import controller
from recipekit.validate.static.volcano import policy_findings, webhook_findings

# A torchrun that behaves like the real one towards its workers' codes: it runs one "worker" (itself), which
# records the code the test asks for, and exits 1 whatever that code was; on SIGTERM the worker records 143.
FAKE_TORCHRUN = """#!{python}
import json, os, signal, sys, time, pathlib
code = int(os.environ.get("WORKER_CODE", "0"))
def record(c):
    d = pathlib.Path(os.environ["RECIPEKIT_EXIT_DIR"])
    (d / "rank-0.json").write_text(json.dumps({{"code": c, "time": time.time(), "rank": "0"}}))
def term(signum, frame):
    record(143)
    sys.exit(1)
signal.signal(signal.SIGTERM, term)
if os.environ.get("WORKER_SLEEP"):
    print("ready", flush=True)
    time.sleep(60)
record(code)
sys.exit(1 if code else 0)
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(["recipe=tiny_sft", "cluster.nodes=1"], tmp_path_factory.mktemp("b") / "bundle").path


@pytest.fixture(scope="module")
def fake_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("bin")
    (directory / "torchrun").write_text(FAKE_TORCHRUN.format(python=sys.executable))
    (directory / "torchrun").chmod(0o755)
    (directory / "python3").symlink_to(sys.executable)
    return directory


def pod_env(fake_bin: Path, **extra: str) -> dict[str, str]:
    return {
        "PATH": f"{fake_bin}:/usr/bin:/bin",
        "HOME": "/tmp",
        "VC_TASK_INDEX": "0",
        "VC_WORKER_HOSTS": "127.0.0.1",
        "VC_WORKER_NUM": "1",
        **extra,
    }


def _job(bundle: Path) -> dict:
    return yaml.safe_load((bundle / "volcano-job.yaml").read_text())


# ------------------------------------------------------------------------------------------------- the table
def test_one_table_with_unique_codes_and_the_constants_read_from_it() -> None:
    codes = [c.code for c in exitcodes.EXIT_CODES]
    assert len(codes) == len(set(codes)) and len({c.name for c in exitcodes.EXIT_CODES}) == len(codes)
    assert exitcodes.EXIT_USER_ERROR == exitcodes.exit_code("user_error") == 2
    assert exitcodes.EXIT_PREEMPTED == 128 + signal.SIGTERM
    with pytest.raises(KeyError):
        exitcodes.exit_code("no_such_code")
    assert exitcodes.exit_code_name(137) == "signal 9"


def test_the_first_failure_is_the_cause_not_the_sigterms_it_caused(tmp_path: Path) -> None:
    def write(rank: int, code: int, at: float) -> None:
        (tmp_path / f"rank-{rank}.json").write_text(json.dumps({"code": code, "time": at, "rank": rank}))

    assert exitcodes.worker_exit_code(tmp_path) is None
    write(0, 0, 1.0)
    assert exitcodes.worker_exit_code(tmp_path) is None
    write(1, exitcodes.EXIT_PREEMPTED, 2.0)
    assert exitcodes.worker_exit_code(tmp_path) == exitcodes.EXIT_PREEMPTED
    write(2, exitcodes.EXIT_PREFLIGHT, 3.0)  # later, but the SIGTERM was torchrun's answer to it
    write(3, exitcodes.EXIT_STALLED, 4.0)
    assert exitcodes.worker_exit_code(tmp_path) == exitcodes.EXIT_PREFLIGHT
    (tmp_path / "rank-4.json").write_text("{cut")
    assert exitcodes.worker_exit_code(tmp_path) == exitcodes.EXIT_PREFLIGHT


def test_record_exit_writes_only_under_the_launcher(tmp_path: Path) -> None:
    exitcodes.record_exit(3, {"RANK": "5"})
    assert not list(tmp_path.iterdir())
    exitcodes.record_exit(3, {"RANK": "5", exitcodes.EXIT_DIR_ENV: str(tmp_path)})
    assert json.loads((tmp_path / "rank-5.json").read_text())["code"] == 3


def test_pod_exit_code_keeps_signals_and_the_workers_code() -> None:
    assert launch.pod_exit_code(0, None, None) == 0
    assert launch.pod_exit_code(1, 2, None) == 2
    assert launch.pod_exit_code(1, None, None) == 1
    assert launch.pod_exit_code(-9, None, None) == 137
    assert launch.pod_exit_code(1, 2, signal.SIGTERM) == 143


# ------------------------------------------------------------------------------------------------ the launcher
@pytest.mark.parametrize("code", [exitcodes.EXIT_USER_ERROR, exitcodes.EXIT_PREFLIGHT, exitcodes.EXIT_STALLED, 0])
def test_the_pod_exits_with_the_workers_code_although_torchrun_exits_1(bundle: Path, fake_bin: Path, code: int) -> None:
    proc = subprocess.run(
        ["bash", str(bundle / "run.sh")],
        env=pod_env(fake_bin, WORKER_CODE=str(code)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == code, proc.stderr
    if code:
        assert f"torchrun exited 1; the pod exits {exitcodes.exit_code_name(code)} ({code})" in proc.stderr


def test_sigterm_reaches_torchrun_and_the_pod_ends_by_the_signal(bundle: Path, fake_bin: Path) -> None:
    proc = subprocess.Popen(
        ["bash", str(bundle / "run.sh")],
        env=pod_env(fake_bin, WORKER_SLEEP="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"  # torchrun runs, as a child of the launcher (no exec)
    time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)  # run.sh exec'd the launcher: this pid is the launcher's
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM, err  # a signal stays a signal (PID 1 would exit 143 instead)
    assert "the pod exits preempted (143)" in err


# ---------------------------------------------------------------------------------------------- the Job's policies
def test_the_jobs_exit_code_policies_come_from_the_table_and_pass_the_webhook(bundle: Path) -> None:
    job = _job(bundle)
    policies = job["spec"]["policies"]
    assert policies[: len(exitcodes.exit_code_policies())] == exitcodes.exit_code_policies()
    assert {p["exitCode"]: p["action"] for p in policies if "exitCode" in p} == {
        exitcodes.EXIT_USER_ERROR: "TerminateJob",
        exitcodes.EXIT_PREFLIGHT: "RestartJob",
        exitcodes.EXIT_STALLED: "RestartJob",
        exitcodes.EXIT_NONFINITE: "TerminateJob",  # a data-caused NaN would repeat on every restart
        exitcodes.EXIT_PREFLIGHT_GATE: "TerminateJob",  # a restart would measure the same slow part again
    }
    assert webhook_findings(job) == []
    assert controller.unreachable_policy_findings(job) == []
    assert controller.contract_policy_findings(job) == []


def test_a_nonfinite_loss_ends_the_job_unless_the_recipe_asks_to_skip_the_batch(bundle: Path, tmp_path: Path) -> None:
    assert controller.pod_failed_action(_job(bundle), exitcodes.EXIT_NONFINITE) == "TerminateJob"
    skip = build(["recipe=tiny_sft", "cluster.nodes=1", "ops.nonfinite_loss=skip"], tmp_path / "skip").path
    job = _job(skip)
    assert controller.pod_failed_action(job, exitcodes.EXIT_NONFINITE) == "RestartJob"
    assert [p for p in job["spec"]["policies"] if "event" in p] == [
        p for p in _job(bundle)["spec"]["policies"] if "event" in p
    ]  # only the exitCode policy differs
    doc = yaml.safe_load((skip / "recipe.yaml").read_text())
    assert controller.contract_policy_findings(job, controller.nonfinite_mode(doc)) == []
    # the skip bundle's Job under a stop recipe is a Job the contract refuses, and the other way round
    (wrong,) = controller.contract_policy_findings(job, "stop")
    assert "exiting 5 (nonfinite) gets RestartJob, the runtime contract says TerminateJob" in wrong.message
    assert controller.contract_policy_findings(_job(bundle), "skip")
    assert "batch | RestartJob (ops.nonfinite_loss: skip) |" in (skip / "README.md").read_text()
    assert "batch | TerminateJob |" in (bundle / "README.md").read_text()


def test_the_webhook_rules_refuse_bad_exit_code_policies() -> None:
    bad = [{"exitCode": 0, "action": "RestartJob"}, {"exitCode": 2, "action": "TerminateJob"}]
    bad += [{"exitCode": 2, "action": "RestartJob"}, {"exitCode": 3, "event": "PodFailed", "action": "RestartJob"}]
    messages = " | ".join(str(f) for f in policy_findings(bad, "spec.policies"))
    assert "0 is not a valid error code" in messages
    assert "duplicate exitCode 2" in messages
    assert "event and exitCode together" in messages


def test_the_simulated_controller_applies_the_jobs_own_policies(bundle: Path) -> None:
    job = _job(bundle)
    task = job["spec"]["tasks"][0]["name"]
    assert controller.pod_failed_action(job, exitcodes.EXIT_USER_ERROR, task) == "TerminateJob"
    assert controller.pod_failed_action(job, exitcodes.EXIT_PREFLIGHT, task) == "RestartJob"
    assert controller.pod_failed_action(job, exitcodes.EXIT_FAILED, task) == "RestartJob"  # PodFailed
    assert controller.action_for(job, event="PodEvicted", task=task) == "RestartJob"
    # a task policy comes first
    job["spec"]["tasks"][0]["policies"] = [{"exitCode": exitcodes.EXIT_FAILED, "action": "AbortJob"}]
    assert controller.pod_failed_action(job, exitcodes.EXIT_FAILED, task) == "AbortJob"


def test_an_exit_code_policy_after_pod_failed_is_reported_as_never_firing(bundle: Path) -> None:
    job = _job(bundle)
    policies = job["spec"]["policies"]
    job["spec"]["policies"] = [p for p in policies if "event" in p] + [p for p in policies if "exitCode" in p]
    task = job["spec"]["tasks"][0]["name"]
    assert controller.pod_failed_action(job, exitcodes.EXIT_USER_ERROR, task) == "RestartJob"  # shadowed
    unreachable = [str(f) for f in controller.unreachable_policy_findings(job)]
    assert len(unreachable) == len(exitcodes.exit_code_policies()) and "never fires" in unreachable[0]
    contract_findings = [str(f) for f in controller.contract_policy_findings(job)]
    assert any(
        "exiting 2 (user_error) gets RestartJob, the runtime contract says TerminateJob" in f for f in contract_findings
    )


def test_the_readme_reads_the_table_and_run_sh_spells_no_code(bundle: Path) -> None:
    """The README lists the table; run.sh exits by none of its own (it execs the launcher, which exits by the
    table: a missing CANN included)."""
    readme = (bundle / "README.md").read_text()
    for entry in exitcodes.EXIT_CODES:
        assert f"| {entry.code} | {entry.name} |" in readme
    template = (Path(__file__).parents[3] / "templates" / "run.sh.j2").read_text()
    assert not re.search(r"\bexit\b", template) and "exec python3 -m {{ launcher }}" in template


def test_the_docs_list_the_table() -> None:
    docs = (Path(__file__).parents[3] / "docs" / "faults.md").read_text()
    for entry in exitcodes.EXIT_CODES:
        action = entry.action or ("none (success)" if entry.code == 0 else "RestartJob (PodFailed)")
        assert f"| {entry.code} | {entry.name} | {entry.meaning} | {action} |" in docs
