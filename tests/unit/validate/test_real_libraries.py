"""The bundle's Trainer arguments and ds_config as the real libraries read them (needs the `train` extra).

This is the check that catches drift: Transformers parses the arguments, DeepSpeed parses its config, and the
Trainer's own DeepSpeed integration compares the two ("Please correct the following DeepSpeed config values that
mismatch TrainingArguments values").
"""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import render_files
from tests.golden.cases import cases

transformers = pytest.importorskip("transformers")


def _bundle(overrides: list[str]) -> tuple[dict, dict | None]:
    files = render_files(overrides)
    args = yaml.safe_load(files["recipe.yaml"])["training_arguments"]
    ds = yaml.safe_load(files["ds_config.json"]) if "ds_config.json" in files else None
    return args, ds


def _cpu_arguments(args: dict, world_size: int = 1) -> transformers.TrainingArguments:
    """Parse as the Trainer would; device-specific choices are swapped for CPU ones and the world size is the
    bundle's, so the check runs here as it would in the cluster."""
    args = {**args, "use_cpu": True, "optim": "adamw_torch", "ddp_backend": None, "deepspeed": None}
    at_world = type(
        "ClusterTrainingArguments", (transformers.TrainingArguments,), {"world_size": property(lambda self: world_size)}
    )
    (parsed,) = transformers.HfArgumentParser(at_world).parse_dict(args, allow_extra_keys=False)
    return parsed


def _trainer_cases() -> list[str]:
    """The golden cases the Trainer runs (a Megatron bundle has no TrainingArguments or ds_config)."""
    from recipekit.bundle.build import resolve

    return sorted(name for name, overrides in cases().items() if resolve(overrides).recipe.engine.kind == "trainer")


@pytest.mark.parametrize("name", _trainer_cases())
def test_trainer_arguments_parse(name: str) -> None:
    args, _ = _bundle(cases()[name])
    parsed = _cpu_arguments(args)
    assert parsed.per_device_train_batch_size == args["per_device_train_batch_size"]
    # The device-specific values are ones Transformers accepts.
    from transformers.training_args import OptimizerNames

    assert args["optim"] in {o.value for o in OptimizerNames}
    assert args["ddp_backend"] in {"nccl", "gloo", "hccl", "mpi", "ccl", "xccl", "cncl", "mccl", None}


@pytest.mark.parametrize("name", [n for n in _trainer_cases() if "parallel=ddp" not in cases()[n]])
def test_ds_config_passes_deepspeed_and_the_trainer_mismatch_check(name: str, monkeypatch) -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime import config as ds_runtime_config
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    args, ds = _bundle(cases()[name])
    if ds is None:
        pytest.skip("DDP bundle: no ds_config")
    plan = yaml.safe_load(render_files(cases()[name])["recipe.yaml"])["plan"]
    hf = HfTrainerDeepSpeedConfig(dict(ds))
    hf.trainer_config_process(_cpu_arguments(args, plan["world_size"]))
    assert hf.mismatches == []  # what trainer_config_finalize would raise on at start-up
    # DeepSpeed's own parser, at the world size the bundle runs at (train_batch_size = micro × accum × world).
    monkeypatch.setattr(ds_runtime_config.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_runtime_config.dist, "get_world_size", lambda *a, **k: plan["world_size"])
    config = ds_runtime_config.DeepSpeedConfig(_resolve_auto(hf.config))
    assert config.train_batch_size == plan["global_batch_size"]
    assert config.zero_optimization_stage == plan["zero_stage"]


def test_mismatch_check_catches_drift() -> None:
    """The check above can fail: a ds_config that disagrees with the Trainer is rejected by Transformers."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    args, ds = _bundle(["recipe=llama3_8b_sft"])
    ds = {**ds, "gradient_accumulation_steps": ds["gradient_accumulation_steps"] + 1}
    hf = HfTrainerDeepSpeedConfig(ds)
    hf.trainer_config_process(_cpu_arguments(args, 8))
    assert any("gradient_accumulation_steps" in m for m in hf.mismatches)


def _resolve_auto(config: dict) -> dict:
    """DeepSpeed rejects "auto" strings the Trainer would have filled: give them plain values for parsing."""

    def fix(value):
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        return 0.0 if value == "auto" else value

    return fix(config)
