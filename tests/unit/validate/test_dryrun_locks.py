"""The dry run's locks are held by processes, not by files: a dead holder's lock is free, a live one's is respected.

DeepSpeed builds its ops under torch's FileBaton, a ``lock`` file whose existence is the lock; a build killed
mid-way left it, and every later dry run waited on it until --timeout. These tests plant such a file, and hold the
dry run's own flocks from other processes, to show what is cleared (with a line saying so) and what is waited for.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.validate.dryrun.options import DryRunUsageError
from recipekit.validate.dryrun.workdir import extensions
from recipekit.validate.dryrun.workdir.extensions import (
    BATON,
    CACHE_LOCK,
    extensions_dir,
    is_built,
    lock_cache,
)
from recipekit.validate.dryrun.workdir.locks import FileLock, claim_workdir
from recipekit.validate.dryrun.workdir.workcopy import MARKER

OP = "deepspeed_shm_comm"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(extensions, "BATON_GRACE_S", 0.2)
    directory = extensions_dir()
    (directory / OP).mkdir(parents=True)
    return directory


def _built(directory: Path) -> None:
    """A finished build of OP: its library and the marker a finished build writes."""
    (directory / OP / f"{OP}.so").write_bytes(b"\x7fELF")
    extensions._marker(directory, OP).write_text(extensions._versions() + "\n", encoding="utf-8")


def _holder(path: Path, mode: str) -> subprocess.Popen[str]:
    """A live process holding ``path`` flocked (``sh``ared, as a dry run's pods do, or ``ex``clusive)."""
    code = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT)\n"
        f"fcntl.flock(fd, fcntl.LOCK_{mode.upper()})\n"
        "if sys.argv[1] == 'ex':\n"
        "    os.write(fd, f'PID {os.getpid()}, started now; a build'.encode())\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, mode], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_dead_builds_baton_is_cleared_with_a_line_saying_so(cache: Path) -> None:
    _built(cache)
    (cache / OP / BATON).write_text("")  # torch's FileBaton, left by a process killed while it held it
    said: list[str] = []
    lock, missing = lock_cache(cache, [OP], said.append, deadline=time.monotonic() + 30)
    assert lock is not None and lock.shared and missing == []
    assert not (cache / OP / BATON).exists()
    assert any("cleared a stale lock" in line and str(cache / OP / BATON) in line for line in said), said
    lock.close()


def test_an_interrupted_build_is_cleared_and_built_again(cache: Path) -> None:
    (cache / OP / "shm.o").write_bytes(b"half")  # g++ killed mid-way: no library, no marker
    (cache / OP / BATON).write_text("")
    said: list[str] = []
    lock, missing = lock_cache(cache, [OP], said.append, deadline=time.monotonic() + 30)
    assert lock is not None and not lock.shared, "the caller builds under the exclusive lock"
    assert missing == [OP] and not (cache / OP).exists(), "the half-built directory is removed"
    assert any("cleared an interrupted build" in line for line in said), said
    lock.close()


def test_a_baton_is_left_alone_while_a_dry_runs_pods_live_and_cleared_once_they_die(cache: Path) -> None:
    _built(cache)
    (cache / OP / BATON).write_text("")
    (cache / CACHE_LOCK).write_text("PID 4194000, started long ago; a dry run building DeepSpeed's ops\n")
    pods = _holder(cache / CACHE_LOCK, "sh")  # another dry run's pods: one may be inside the baton right now
    try:
        said: list[str] = []
        lock, _ = lock_cache(cache, [OP], said.append, deadline=time.monotonic() + 1.5)
        assert lock is None and (cache / OP / BATON).exists()
        waiting = [line for line in said if line.startswith("waiting for the other dry runs using DeepSpeed's ops")]
        assert waiting and "4194000" not in waiting[0], "a dead builder is not named as the one waited for"
    finally:
        pods.kill()
        pods.wait()
    lock, missing = lock_cache(cache, [OP], said.append, deadline=time.monotonic() + 30)
    assert lock is not None and missing == [] and not (cache / OP / BATON).exists()
    lock.close()


def test_the_cache_is_held_shared_so_two_dry_runs_with_built_ops_run_side_by_side(cache: Path) -> None:
    _built(cache)
    first, _ = lock_cache(cache, [OP], lambda line: None, deadline=time.monotonic() + 5)
    second, _ = lock_cache(cache, [OP], lambda line: None, deadline=time.monotonic() + 5)
    assert first is not None and second is not None and first.shared and second.shared
    assert is_built(cache, OP)
    first.close()
    second.close()


def test_a_build_in_progress_is_waited_for_and_its_holder_named(cache: Path) -> None:
    builder = _holder(cache / CACHE_LOCK, "ex")
    try:
        said: list[str] = []
        lock, _ = lock_cache(cache, [OP], said.append, deadline=time.monotonic() + 1)
        assert lock is None
        waiting = [line for line in said if line.startswith("waiting for the other dry runs using DeepSpeed's ops")]
        assert waiting and f"PID {builder.pid}, started now" in waiting[0], said
    finally:
        builder.kill()
        builder.wait()


def test_a_work_directory_is_held_by_one_run_and_free_when_it_dies(tmp_path: Path) -> None:
    root = tmp_path / "work"
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from recipekit.validate.dryrun.workdir.locks import claim_workdir\n"
        f"lock = claim_workdir(Path({str(root)!r}), {MARKER!r})\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n"
    )
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "held"
        with pytest.raises(DryRunUsageError) as refused:
            claim_workdir(root, MARKER)
        message = str(refused.value)
        assert f"PID {other.pid}, started " in message and "--workdir" in message and "\n" not in message
    finally:
        os.kill(other.pid, signal.SIGKILL)
        other.wait()
    claim_workdir(root, MARKER).close()  # its holder died: the directory is free


def test_a_second_dry_run_of_a_bundle_is_refused_in_one_line_before_any_pod(tmp_path: Path) -> None:
    """Two runs of one bundle and one work directory: the second stops at once, naming the first and --workdir."""
    from recipekit.bundle.build import build
    from recipekit.cli.validate import validate_command

    bundle = build(["recipe=tiny_sft"], tmp_path / "bundle", force=True).path
    workdir = tmp_path / "work"
    held = claim_workdir(workdir, MARKER)  # the first run, preparing its work copy
    try:
        result = CliRunner().invoke(validate_command, [str(bundle), "--dry-run", "--workdir", str(workdir)])
    finally:
        held.close()
    assert result.exit_code == 2, result.output
    error = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and f"PID {os.getpid()}" in error[0] and "--workdir" in error[0], result.output
    assert "Traceback" not in result.output and not (workdir / "bundle").exists()


def test_two_runs_that_both_find_a_dead_baton_do_not_wait_for_each_other(cache: Path) -> None:
    """Each holds the cache shared and wants it alone: the shared hold is let go first, so one clears the baton
    and the other then finds it gone."""
    _built(cache)
    (cache / OP / BATON).write_text("")
    other = FileLock.open(cache / CACHE_LOCK)
    assert other.try_lock(shared=True)  # the other run, still looking
    said: list[str] = []
    try:
        lock, _ = lock_cache(cache, [OP], said.append, deadline=time.monotonic() + 1.5)
        assert lock is None, "it waits while the other holds the cache"
        other.unlock()  # the other run let go to wait for the exclusive lock
        lock, missing = lock_cache(cache, [OP], said.append, deadline=time.monotonic() + 10)
        assert lock is not None and lock.shared and missing == [] and not (cache / OP / BATON).exists()
        assert other.try_lock(shared=True), "and the other then holds it shared beside it"
        lock.close()
    finally:
        other.close()


def test_the_build_shows_its_progress_as_one_line_and_marks_what_it_finished(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build runs in a child (here a stand-in that prints what torch and ninja print); its progress is one
    rewritten line with the op, ninja's step and the seconds so far; a finished op gets its marker."""
    from types import SimpleNamespace

    from recipekit.validate.shared.results import Result

    def builder(builders: list[str], directory: Path) -> str:
        return (
            "import json, time\n"
            f"print('building {OP}', flush=True)\n"
            "print('[1/3] c++ -c shm.cpp', flush=True)\n"
            "time.sleep(2.5)\n"
            f"open({str(cache / OP / (OP + '.so'))!r}, 'wb').write(b'ELF')\n"
            f"print({extensions._OPS_LINE!r} + json.dumps([{{'op': {OP!r}, 'status': 'built', 'seconds': 2.5}}]))\n"
        )

    monkeypatch.setattr(extensions, "_builder_code", builder)
    work = SimpleNamespace(deepspeed_extensions=["ShareMemCommBuilder"], logs=tmp_path / "logs")
    said: list[str] = []
    result = Result("dryrun.ops", "ops")
    lock = extensions.build_extensions(work, dict(os.environ), result, said.append, time.monotonic() + 60)  # type: ignore[arg-type]
    assert lock is not None and lock.shared and not result.failed, result.reason
    assert said[0].startswith(f"building DeepSpeed's C++ ops ({OP}) with g++")
    ticks = [line for line in said[1:] if line.startswith(extensions.BUILD_PROGRESS)]
    assert ticks and f"{extensions.BUILD_PROGRESS} {OP} [1/3], " in ticks[-1], said
    assert is_built(cache, OP) and result.reason.startswith(f"built {OP} in ")
    lock.close()


def test_a_lock_file_that_is_a_link_or_a_fifo_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "work"
    root.mkdir()
    (root / MARKER).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(DryRunUsageError, match="cannot open"):
        claim_workdir(root, MARKER)
    assert not (tmp_path / "elsewhere").exists(), "nothing is created through the link"
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError, match="not a regular file"):
        FileLock.open(tmp_path / "fifo")
