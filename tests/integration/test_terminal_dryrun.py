"""The README's pod-kill dry run in a real 80 × 40 terminal: the spinner, the phase lines and the report see the
pods' own log lines (gloo's ``[/__w/pytorch/...pair.cc:553]``) and must show them, not parse them as markup.

Piped (as every other dry-run test runs it) rich takes its non-interactive path, which never crashed; so this one
runs the CLI on a pseudo-terminal. Slow: one dry run with a kill and a restart (2-4 minutes on 2 cores).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from recipekit.bundle.build import build
from tests.pty_terminal import plain_text, run_in_terminal, visible_lines

pytestmark = pytest.mark.slow

_MISSING = [m for m in ("torch", "transformers", "deepspeed") if importlib.util.find_spec(m) is None]
if _MISSING:
    pytest.skip(f"the training stack is not installed ({', '.join(_MISSING)})", allow_module_level=True)

SRC = Path(__file__).resolve().parents[2] / "src"


def test_the_pod_kill_dry_run_in_an_80_column_terminal(tmp_path: Path) -> None:
    bundle = build(["recipe=llama3_8b_sft"], tmp_path / "llama3_8b_sft").path
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "recipekit.cli", "validate", str(bundle), "--dry-run", "--pods", "2"]
    argv += ["--kill-pod", "1", "--at-step", "6", "--workdir", str(tmp_path / "work"), "--timeout", "600"]
    run = run_in_terminal(argv, columns=80, rows=40, env=env, timeout=900)
    text = plain_text(run.output)
    assert "MarkupError" not in text and "Traceback" not in text, text[-4000:]
    assert run.returncode == 0 and "bundle OK" in text, text[-4000:]
    too_wide = [line for line in visible_lines(run.output) if len(line) > 80]
    assert not too_wide, too_wide[:5]
