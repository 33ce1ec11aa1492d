"""Every Python child recipekit starts imports the bundle and the installed libraries, never the current directory.

A ``runtime/`` package and a ``yaml.py`` planted in the directory recipekit runs from would otherwise win over the
bundle's runtime and the real yaml (``python -m`` puts the cwd first on sys.path). Each plant writes a marker file
when imported; none may appear.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from recipekit.bundle.build import build
from recipekit.validate.shared.childpython import python_argv, safe_env

SRC = Path(__file__).resolve().parents[3] / "src"


def plant(directory: Path, markers: Path) -> None:
    """A cwd whose runtime package and yaml module announce themselves by writing into ``markers``."""
    (directory / "runtime").mkdir(parents=True)
    for name, module in (("runtime/__init__.py", "runtime"), ("runtime/dataprep.py", "dataprep"), ("yaml.py", "yaml")):
        (directory / name).write_text(f"open({str(markers / module)!r}, 'w').close()\n")


@pytest.mark.parametrize(
    "args", [("-c", "import importlib.util as u; print(u.find_spec('runtime'))"), ("-c", "import yaml; print(yaml)")]
)
def test_python_argv_keeps_the_cwd_off_the_path(tmp_path: Path, args: tuple[str, ...]) -> None:
    cwd, markers = tmp_path / "cwd", tmp_path / "markers"
    markers.mkdir()
    plant(cwd, markers)
    env = safe_env({k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    proc = subprocess.run(python_argv(*args), cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not list(markers.iterdir())
    assert str(cwd) not in proc.stdout


def test_data_commands_run_the_bundles_runtime_not_the_cwds(tmp_path: Path) -> None:
    bundle = build(["recipe=tiny_sft"], tmp_path / "bundle", force=True).path
    cwd, markers = tmp_path / "cwd", tmp_path / "markers"
    markers.mkdir()
    plant(cwd, markers)
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    for command in (["data", "verify", str(bundle)], ["data", "prepare", str(bundle), "--workers", "1", "--json"]):
        proc = subprocess.run(
            [sys.executable, "-P", "-m", "recipekit.cli", *command],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert not list(markers.iterdir()), (command, proc.stdout[-2000:], proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
