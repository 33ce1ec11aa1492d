"""A Qwen3-MoE bundle dry-runs as a tiny Qwen3 MoE on two simulated pods: it trains, a pod is killed at step 6 and
the restarted job resumes from checkpoint-4, under ZeRO-3 (whose MoE blocks the runtime marks as ZeRO-3 leaf
modules, or the ranks' parameter fetches would not match) and under ZeRO-2. Slow: one dry run each, about 3-5
minutes on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.bundle.build import build
from recipekit.cli.validate import validate_command
from tests.integration.test_dryrun import TIMEOUT_S, processes_under

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("stage", "victim"), [(3, 0), (2, 1)], ids=["zero3-master", "zero2-worker"])
def test_moe_bundle_trains_is_killed_and_resumes(tmp_path: Path, stage: int, victim: int) -> None:
    overrides = ["model=qwen3_30b_a3b", "mode=sft", f"parallel=zero{stage}"]
    bundle = build(overrides, tmp_path / "bundle", force=True, allow_oom=True).path
    workdir = tmp_path / "work"
    args = [str(bundle), "--dry-run", "--pods", "2", "--kill-pod", str(victim), "--at-step", "6"]
    args += ["--workdir", str(workdir), "--timeout", str(TIMEOUT_S), "--json"]
    result = CliRunner().invoke(validate_command, args)
    document = json.loads(result.stdout)
    checks = {c["id"]: c for c in document["checks"]}
    assert result.exit_code == 0, json.dumps({k: checks[k] for k in checks if k.startswith("dryrun")}, indent=1)
    # the twin is the Qwen3 MoE one, not a Llama
    assert "tiny_qwen3_moe" in result.stdout
    logs = "\n".join(p.read_text(errors="replace") for p in workdir.rglob("*.log"))
    if stage == 3:
        assert "Qwen3MoeSparseMoeBlock" in logs and "marked as leaf modules" in logs
    else:
        assert "marked as leaf modules" not in logs
    resume = checks["dryrun.resume"]["details"]
    assert resume["killed_pod"] == victim and resume["killed_at_step"] == 6
    assert resume["resumed_step"] == 4 and resume["first_step_after_restart"] == 5
    assert resume["replayed_loss_max_abs_diff"] < 1e-3
    assert checks["dryrun.train"]["details"]["final_step"] == 8
    assert processes_under(workdir) == []
