"""The dry run of a streaming bundle (``data.streaming``): two pods train on the stream with no prepare step and no
shards, a pod killed at step 6 is restarted, and the resumed run starts the stream at checkpoint-4's row.

Exactness is judged by the dry run itself: steps 5-6 are trained twice from the same state, so equal losses mean
the resumed run drew the very rows the first one did. Slow (two attempts of two pods): ``-m 'not slow'`` skips it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.bundle.build import build
from recipekit.cli.validate import validate_command
from recipekit.runtime.boundary import filenames

pytestmark = pytest.mark.slow

_MISSING = [m for m in ("torch", "transformers", "deepspeed", "datasets") if importlib.util.find_spec(m) is None]
if _MISSING:
    pytest.skip(f"the training stack is not installed ({', '.join(_MISSING)})", allow_module_level=True)

TIMEOUT_S = 420


def test_a_streaming_bundle_trains_and_resumes_at_the_exact_row_after_a_pod_is_killed(tmp_path: Path) -> None:
    bundle = build(["recipe=tiny_sft", "data.streaming=true"], tmp_path / "bundle", force=True).path
    workdir = tmp_path / "work"
    arguments = ["--dry-run", "--pods", "2", "--kill-pod", "1", "--at-step", "6", "--workdir", str(workdir)]
    result = CliRunner().invoke(validate_command, [str(bundle), *arguments, "--timeout", str(TIMEOUT_S), "--json"])
    checks = {c["id"]: c for c in json.loads(result.stdout)["checks"]}
    assert result.exit_code == 0, json.dumps({k: checks[k] for k in checks if k.startswith("dryrun")}, indent=1)
    resume, train = checks["dryrun.resume"]["details"], checks["dryrun.train"]["details"]
    assert resume["resumed_step"] == 4 and resume["first_step_after_restart"] == 5
    assert resume["replayed_loss_max_abs_diff"] < 1e-3  # steps 5-6 trained twice: the same rows both times
    assert train["final_step"] == 8 and train["checkpoints"][-1] == 8
    # The stream's own account: no shards, the resumed run starts at 4 steps × 4 rows, knowing the skipped chunks.
    assert train["data"]["streaming"] is True and train["data"]["start_row"] == 0 and train["data"]["chunks"] >= 4
    assert resume["data"]["start_row"] == 16 and resume["data"]["chunks_known"] >= 1
    runs = workdir / "shared" / "runs"
    assert not (runs / "prepared").exists()
    (output,) = [p for p in runs.iterdir() if p.is_dir()]
    state = json.loads((output / "checkpoint-4" / filenames.STREAM_STATE_FILE).read_text())
    assert sum(entry["rows"] for entry in state["known"].values()) >= 16
    assert "attempt 1: train.py streams the data" in result.stderr and "from row 16" in result.stderr
