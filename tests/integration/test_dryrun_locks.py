"""A dry run interrupted at any moment never harms the next one, and a kill lands at its step whatever the load.

The first test builds DeepSpeed's op in a cache of its own, kills the dry run's whole process group while g++ runs
(torch's FileBaton ``lock`` is left behind, as a Ctrl-C, --timeout or a killed test left it), and then runs another
dry run: it must say that it cleared the dead build's lock, build the op again and pass. The second keeps both
cores busy while a kill dry run trains to its kill: the pods hold at the step boundary until the kill, so it lands at
step 6. The third starts two dry runs of one bundle side by side: the second is refused in one line, before any pod
starts.
Slow (minutes: the first one builds the op twice with g++).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from recipekit.bundle.build import build
from recipekit.validate.dryrun.workdir.extensions import BATON, extensions_dir

pytestmark = pytest.mark.slow

_MISSING = [m for m in ("torch", "transformers", "deepspeed", "datasets") if importlib.util.find_spec(m) is None]
if _MISSING:
    pytest.skip(f"the training stack is not installed ({', '.join(_MISSING)})", allow_module_level=True)

TIMEOUT_S = 900
OP = "deepspeed_shm_comm"


def _validate(bundle: Path, workdir: Path, env: dict[str, str], *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "recipekit.cli",
        "validate",
        str(bundle),
        "--dry-run",
        "--workdir",
        str(workdir),
        "--timeout",
        str(TIMEOUT_S),
        *extra,
    ]


@pytest.mark.longest
def test_a_dry_run_killed_mid_build_does_not_stop_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # nothing built yet: the first run builds
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    baton = extensions_dir() / OP / BATON
    bundle = build(["recipe=tiny_sft"], tmp_path / "bundle", force=True).path
    first = subprocess.Popen(
        _validate(bundle, tmp_path / "work", env),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        until = time.monotonic() + 600
        while not baton.exists() and first.poll() is None and time.monotonic() < until:
            time.sleep(0.2)
        assert baton.exists(), "the build never started"
        time.sleep(3)  # g++ is running
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the dry run and its build, at once, as a killed test leaves them
        first.wait()
    time.sleep(1)
    assert baton.exists(), "the killed build left torch's lock behind (what used to stall every later run)"

    second = subprocess.run(
        _validate(bundle, tmp_path / "work", env, "--json"),
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S + 60,
    )
    checks = {c["id"]: c for c in json.loads(second.stdout)["checks"]}
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"cleared an interrupted build of DeepSpeed's {OP} op ({baton})" in second.stderr, second.stderr
    assert checks["dryrun.ops"]["status"] == "pass" and "built" in checks["dryrun.ops"]["reason"]
    assert not baton.exists()


@contextmanager
def busy_cores(seconds: float) -> Iterator[None]:
    """Every core busy with a loop of its own (each ends by itself after ``seconds``, and is killed on exit)."""
    loop = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
    loops = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for proc in loops:
            proc.kill()
            proc.wait()


def test_a_kill_lands_at_its_step_with_every_core_busy(tmp_path: Path) -> None:
    """Every core is kept busy from the first training step until the pod to be killed holds at the kill's step: the
    load the kill must not lag behind (the steps it races; the imports and set-up before them race nothing, and
    loading them too cost the suite a minute of both cores). The restarted attempt then runs on a machine as loaded
    as the suite leaves it (the loops would only slow its resume, which test_dryrun checks)."""
    bundle = build(["recipe=tiny_sft"], tmp_path / "bundle", force=True).path
    command = _validate(bundle, tmp_path / "work", dict(os.environ), "--kill-pod", "1", "--at-step", "6", "--json")
    out = tmp_path / "validate.json"
    with out.open("w") as stdout:  # a file, not a pipe: nobody reads a pipe while the cores are kept busy
        run = subprocess.Popen(command, stdout=stdout, stderr=subprocess.DEVNULL, text=True)
        try:
            logs = tmp_path / "work" / "logs"
            _wait_for_the_log(logs / "pod-0.log", run, TRAINING_STARTED)
            with busy_cores(TIMEOUT_S):
                _wait_for_the_log(logs / "pod-1.log", run, "holding after step 6 until this pod is killed")
            run.wait(timeout=TIMEOUT_S + 60)
        finally:
            run.kill()  # a no-op once it has exited
    checks = {c["id"]: c for c in json.loads(out.read_text())["checks"]}
    assert run.returncode == 0, json.dumps({k: v for k, v in checks.items() if k.startswith("dryrun")})[-4000:]
    resume = checks["dryrun.resume"]["details"]
    assert resume["killed_at_step"] == 6 and resume["kill_requested_at_step"] == 6
    assert resume["resumed_step"] == 4 and checks["dryrun.train"]["details"]["final_step"] == 8


#: What rank 0 logs as the Trainer starts its first step (runtime/ops/phases.py, the watchdog's budgets).
TRAINING_STARTED = "hang watchdog:"


def _wait_for_the_log(log: Path, run: subprocess.Popen, said: str) -> None:
    """Until the pod's log says ``said`` (the first step, or the hold the kill comes next after), or the dry run
    ended."""
    until = time.monotonic() + TIMEOUT_S
    while run.poll() is None and time.monotonic() < until:
        if log.is_file() and said in log.read_text(errors="replace"):
            return
        time.sleep(0.2)


def test_two_dry_runs_of_one_bundle_one_runs_the_other_says_why_not(tmp_path: Path) -> None:
    """Two real `validate --dry-run` of one bundle and one work directory, side by side: the second stops at once, in
    one line naming the first's PID and start time and --workdir; the first is not disturbed."""
    from click.testing import CliRunner

    from recipekit.cli.validate import validate_command
    from recipekit.validate.dryrun.workdir.workcopy import MARKER

    bundle = build(["recipe=tiny_sft"], tmp_path / "bundle", force=True).path
    workdir = tmp_path / "work"
    first = subprocess.Popen(
        _validate(bundle, workdir, dict(os.environ)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        until = time.monotonic() + 300
        while first.poll() is None and time.monotonic() < until:
            if f"PID {first.pid}," in ((workdir / MARKER).read_text() if (workdir / MARKER).is_file() else ""):
                break
            time.sleep(0.2)
        second = CliRunner().invoke(validate_command, [str(bundle), "--dry-run", "--workdir", str(workdir)])
        assert first.poll() is None, "the first run is still running"
    finally:
        # Ctrl-C, as a terminal sends it: SIGINT to the whole group, whichever phase the first run is in (its static
        # checks on a cold machine, or its pods)
        os.killpg(first.pid, signal.SIGINT)
        _, stderr = first.communicate(timeout=120)
    assert second.exit_code == 2, second.output
    errors = [line for line in second.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"PID {first.pid}, started " in errors[0] and "--workdir" in errors[0], second.output
    assert first.returncode == 130 and "interrupted: every pod process was stopped" in stderr
