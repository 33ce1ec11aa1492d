"""The Megatron engine's venv for the dry run (validate/dryrun/workdir/enginevenv.py): built from exact pins only, one
directory per pins file and interpreter, reused once its marker is written, rebuilt when a build was cut short, and
never blocked by the lock of a build that was killed."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from recipekit.validate.dryrun.workdir import enginevenv
from recipekit.validate.dryrun.workdir.enginevenv import EngineVenvError, build_engine_venv, pinned, venv_dir
from recipekit.validate.dryrun.workdir.locks import FileLock


@pytest.fixture
def pins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "engine.txt"
    path.write_text("# why\ntorch==2.13.0  # the CPU wheel\n\nmegatron-bridge==0.3.1\n", encoding="utf-8")
    return path


def fake_build(calls: list[Path]):
    def build(directory: Path, pins: Path, progress, deadline: float) -> tuple[str, ...]:
        calls.append(directory)
        shutil.rmtree(directory, ignore_errors=True)  # as the real build starts
        (directory / "bin").mkdir(parents=True)
        (directory / "bin" / "python").write_text("", encoding="utf-8")
        installed = ("torch==2.13.0", "megatron-bridge==0.3.1")
        marker = {"pins": pinned(pins), "installed": list(installed)}
        (directory / enginevenv.MARKER).write_text(json.dumps(marker), encoding="utf-8")
        return installed

    return build


def test_the_projects_pins_are_exact_and_cpu_only() -> None:
    lines = pinned()
    names = {line.split("==")[0].lower().replace("_", "-"): line.split("==")[1] for line in lines}
    assert names["torch"] == enginevenv.TORCH
    assert (names["megatron-bridge"], names["megatron-core"]) == ("0.3.1", "0.16.1")
    assert names["transformers"].startswith("4.")
    assert not any(name.startswith(("nvidia-cu", "nvidia-nccl", "transformer-engine")) for name in names), names


@pytest.mark.parametrize("line", ["torch>=2.13", "megatron-bridge", "triton==3.*", "x==1.0; python_version>'3'"])
def test_anything_but_an_exact_pin_is_refused(pins: Path, line: str) -> None:
    pins.write_text(f"torch==2.13.0\n{line}\n", encoding="utf-8")
    with pytest.raises(EngineVenvError, match=r"engine.txt:2: .* is not an exact pin"):
        pinned(pins)


def test_the_directory_follows_the_pins(pins: Path) -> None:
    first = venv_dir(pins)
    pins.write_text(pins.read_text() + "einops==0.8.2\n", encoding="utf-8")
    assert venv_dir(pins) != first and venv_dir(pins).parent == first.parent


def test_built_once_then_reused(pins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(enginevenv, "_build", fake_build(calls))
    first = build_engine_venv(pins)
    again = build_engine_venv(pins)
    assert len(calls) == 1 and not first.reused and again.reused
    assert again.python == venv_dir(pins) / "bin" / "python"
    assert again.installed == ("torch==2.13.0", "megatron-bridge==0.3.1")


def test_a_build_cut_short_is_built_again(pins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (venv_dir(pins) / "bin").mkdir(parents=True)  # what a killed build leaves: no marker
    calls: list[Path] = []
    monkeypatch.setattr(enginevenv, "_build", fake_build(calls))
    assert not build_engine_venv(pins).reused and calls == [venv_dir(pins)]


def _hold(path: str, ready: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    lock = FileLock.open(Path(path))
    lock.lock()
    lock.write_holder("a build about to be killed")
    ready.set()
    time.sleep(600)


def test_a_killed_builders_lock_does_not_hang_the_next(pins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv_dir(pins).parent.mkdir(parents=True)
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    holder = context.Process(target=_hold, args=(str(venv_dir(pins).parent / enginevenv.LOCK), ready))
    holder.start()
    assert ready.wait(30)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    calls: list[Path] = []
    monkeypatch.setattr(enginevenv, "_build", fake_build(calls))
    started = time.monotonic()
    assert not build_engine_venv(pins, timeout_s=20).reused
    assert time.monotonic() - started < 10 and len(calls) == 1


def test_a_live_holder_is_waited_for_until_the_timeout(pins: Path) -> None:
    venv_dir(pins).parent.mkdir(parents=True)
    lock = FileLock.open(venv_dir(pins).parent / enginevenv.LOCK)
    lock.lock()
    lock.write_holder("another build")
    context = multiprocessing.get_context("fork")
    result = context.Queue()

    def other() -> None:
        try:
            build_engine_venv(pins, timeout_s=1.0)
            result.put("built")
        except EngineVenvError as exc:
            result.put(str(exc))

    waiter = context.Process(target=other)
    waiter.start()
    waiter.join(30)
    lock.close()
    assert "was still held (PID" in result.get(timeout=5)


class _Steps:
    """The build's commands, recorded instead of run (the venv step makes bin/python); ``failing`` is the program
    whose install fails (uv: an index only pip is configured for)."""

    def __init__(self, failing: str = "") -> None:
        self.argvs: list[list[str]] = []
        self.envs: list[dict[str, str]] = []
        self.failing = failing

    def run(self, argv: list[str], **kwargs) -> object:
        self.argvs.append(argv)
        self.envs.append(kwargs["env"])
        if argv[1:4] == ["-P", "-m", "venv"]:
            (Path(argv[4]) / "bin").mkdir(parents=True)
            (Path(argv[4]) / "bin" / "python").write_text("", encoding="utf-8")
        failed = self.failing and Path(argv[0]).name == self.failing
        return type("Done", (), {"returncode": 1 if failed else 0})()


@pytest.mark.parametrize("failing", ["", "uv"])
def test_pip_installs_torch_first_and_uv_the_pins_or_pip_where_uv_fails(
    pins: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """pip alone reads the machine's configuration that names the local CPU wheel (uv would take PyPI's CUDA torch):
    torch goes first with pip; the pins with uv, which keeps that torch (it satisfies the pin); pip where uv fails."""
    steps = _Steps(failing)
    monkeypatch.setattr(enginevenv.subprocess, "run", steps.run)
    monkeypatch.setattr(enginevenv, "uv_binary", lambda: "/opt/bin/uv")
    monkeypatch.setattr(enginevenv, "_check", lambda python, log: ("torch==2.13.0+cpu", "megatron-bridge==0.3.1"))
    venv = build_engine_venv(pins)
    installs = [argv[argv.index("install") :] if "install" in argv else argv for argv in steps.argvs[1:]]
    assert installs[0] == ["install", "--no-deps", "--no-input", "torch==2.13.0"]
    assert steps.argvs[1][1:4] == ["-P", "-m", "pip"]  # a pip/ planted in the cwd is never imported
    assert steps.argvs[2][0] == "/opt/bin/uv" and installs[1][-2:] == ["-r", str(pins)] and "--no-deps" in installs[1]
    # uv reads no uv.toml or [tool.uv] of the cwd or above it (an untrusted tree's index); Pythons below, no cwd
    assert steps.envs[2]["UV_NO_CONFIG"] == "1" and all(env["PYTHONSAFEPATH"] == "1" for env in steps.envs)
    if failing:
        assert steps.argvs[3][1:4] == ["-P", "-m", "pip"] and installs[2] == [
            "install",
            "--no-deps",
            "--no-input",
            "-r",
            str(pins),
        ]
    assert len(steps.argvs) == (4 if failing else 3) and not venv.reused


def test_without_uv_pip_installs_every_pin(pins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = _Steps()
    monkeypatch.setattr(enginevenv.subprocess, "run", steps.run)
    monkeypatch.setattr(enginevenv, "uv_binary", lambda: None)
    monkeypatch.setattr(enginevenv, "_check", lambda python, log: ("torch==2.13.0+cpu",))
    build_engine_venv(pins)
    assert [argv[1:4] for argv in steps.argvs[1:]] == [["-P", "-m", "pip"], ["-P", "-m", "pip"]]
    assert steps.argvs[2][-2:] == ["-r", str(pins)]
