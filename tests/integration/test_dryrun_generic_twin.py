"""Models of any architecture dry-run as a generic tiny twin shrunk from their own config (no hand-made twin of their
family exists): a DeepSeek-V3-shaped model (MLA, a shared expert beside group-routed experts, dense first layers)
with LoRA under ZeRO-3, as the deepseek_v3_lora preset runs it (the adapters' targets found from the twin's module
tree: attention projections and the fused routed experts), and a Gemma-3-shaped one (sliding-window and global
layers) in full SFT under ZeRO-2, as gemma3_27b_sft; each imported by `recipekit model import` into a team recipe
tree and trained on two simulated pods; the DeepSeek-V3 one is killed at step 6 and resumes from checkpoint-4 (its
ZeRO-3 partitions of MLA and fused experts are the harder checkpoint). Slow: one dry run each, about a minute.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.bundle.build import build
from recipekit.cli import main as cli
from recipekit.cli.validate import validate_command
from tests.integration.test_dryrun import TIMEOUT_S, processes_under

pytestmark = pytest.mark.slow

SHAPES = Path(__file__).resolve().parents[1] / "data" / "twin_shapes"


def imported(tmp_path: Path, shape: str) -> Path:
    """A team recipe tree holding the model option `recipekit model import` writes for ``shape``'s config.json."""
    tree = tmp_path / "recipes"
    target = tree / "model" / f"{shape}.yaml"
    result = CliRunner().invoke(cli, ["model", "import", str(SHAPES / shape), "-o", str(target)])
    assert result.exit_code == 0, result.output
    return tree


def dry_run(bundle: Path, workdir: Path, victim: int | None) -> tuple[dict, str]:
    """The dry run's JSON report and its stdout, pod ``victim`` killed at step 6 (None: no kill)."""
    args = [str(bundle), "--dry-run", "--pods", "2"]
    args += ["--kill-pod", str(victim), "--at-step", "6"] if victim is not None else []
    args += ["--workdir", str(workdir), "--timeout", str(TIMEOUT_S), "--json"]
    result = CliRunner().invoke(validate_command, args)
    document = json.loads(result.stdout)
    checks = {c["id"]: c for c in document["checks"]}
    assert result.exit_code == 0, json.dumps({k: checks[k] for k in checks if k.startswith("dryrun")}, indent=1)
    return checks, result.stdout


def assert_killed_and_resumed(checks: dict, workdir: Path, victim: int) -> None:
    resume = checks["dryrun.resume"]["details"]
    assert resume["killed_pod"] == victim and resume["killed_at_step"] == 6
    assert resume["resumed_step"] == 4 and resume["first_step_after_restart"] == 5
    assert resume["replayed_loss_max_abs_diff"] < 1e-3
    assert checks["dryrun.train"]["details"]["final_step"] == 8
    assert processes_under(workdir) == []


def twin_config(workdir: Path) -> dict:
    """The twin's config mapping in the work copy's recipe.yaml (what the runtime built the twin from)."""
    import yaml

    recipe = yaml.safe_load((workdir / "bundle" / "recipe.yaml").read_text())
    return recipe["recipe"]["model"]["config"]


def test_a_deepseek_v3_shaped_model_dry_runs_lora_on_its_generic_twin_under_zero3(tmp_path: Path) -> None:
    tree = imported(tmp_path, "deepseek_v3_shape")
    # PEFT adapts fused experts through its ParamWrapper, which takes no dropout (build says so otherwise)
    overrides = ["model=deepseek_v3_shape", "mode=lora", "mode.lora.dropout=0", "parallel=zero3"]
    bundle = build(overrides, tmp_path / "bundle", extra_dirs=[tree], force=True, allow_oom=True).path
    workdir = tmp_path / "work"
    checks, stdout = dry_run(bundle, workdir, victim=0)
    assert "twin_deepseek_v3_shape" in stdout and "generic tiny deepseek_v3 twin" in stdout
    config = twin_config(workdir)
    # MLA, a shared expert beside the routed ones, and the dense first layers before one MoE layer
    assert config["q_lora_rank"] and config["kv_lora_rank"] and config["n_shared_experts"] == 1
    assert config["num_hidden_layers"] == config["first_k_dense_replace"] + 1 == 4
    logs = "\n".join(p.read_text(errors="replace") for p in workdir.rglob("*.log"))
    assert "DeepseekV3MoE" in logs and "marked as leaf modules" in logs
    adapted = next(line for line in logs.splitlines() if "lora: adapting" in line)
    assert all(name in adapted for name in ("q_a_proj", "kv_a_proj_with_mqa", "o_proj", "experts.gate_up_proj"))
    assert "'gate'" not in adapted  # the router is left alone
    assert_killed_and_resumed(checks, workdir, victim=0)


def test_a_gemma3_shaped_model_dry_runs_its_generic_twin_under_zero2(tmp_path: Path) -> None:
    tree = imported(tmp_path, "gemma3_shape")
    overrides = ["model=gemma3_shape", "mode=sft", "parallel=zero2"]
    bundle = build(overrides, tmp_path / "bundle", extra_dirs=[tree], force=True, allow_oom=True).path
    workdir = tmp_path / "work"
    checks, stdout = dry_run(bundle, workdir, victim=None)  # the kill and resume: the DeepSeek-V3 twin's, above
    assert "twin_gemma3_shape" in stdout and "generic tiny gemma3_text twin" in stdout
    config = twin_config(workdir)
    # the layer pattern kept: five sliding-window layers, then a global one; the window shorter than a sequence
    assert config["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    assert config["sliding_window"] < 128
    assert checks["dryrun.train"]["details"]["final_step"] == 8
    assert processes_under(workdir) == []
