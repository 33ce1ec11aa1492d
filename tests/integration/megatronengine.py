"""The Megatron room's run for the SIGTERM test: a bundle directory (recipe.yaml with a ``megatron`` document, the
runtime package beside it, tiny data on a "volume"), started as the launcher starts a pod's workers.

Until the build side renders this engine's bundles, :func:`make_bundle` writes what it will: the Trainer preset
``tiny_sft``'s recipe, plan and operations (tests/golden) with the twin, data and paths of the case, and the
document from tests/fixtures/megatron/document.yaml with the case's layout. :func:`start` is the one place that
starts a run (torchrun, ``-m runtime.megatron.train --recipe recipe.yaml --resume auto``): when bundles of this
engine exist, it becomes their run.sh under the dry run's simulated pod, and the tests stay as they are.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recipekit.runtime.boundary import exitcodes, metricslog
from recipekit.validate.dryrun.workdir import megatroncpu
from recipekit.validate.dryrun.workdir.tinydata import write_tiny_dataset

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "src" / "recipekit" / "runtime"
TEMPLATE = ROOT / "tests" / "golden" / "bundles" / "tiny_sft" / "recipe.yaml"
DOCUMENT = ROOT / "tests" / "fixtures" / "megatron" / "document.yaml"
MODELS = ROOT / "recipes" / "model"
#: ModelView's keys a model option may leave out, with the values recipekit's schema gives them.
MODEL_DEFAULTS: dict[str, Any] = {
    "trust_remote_code": False,
    "head_dim_override": 0,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "num_experts": 0,
    "experts_per_token": 0,
    "moe_intermediate_size": 0,
    "router_aux_loss_coef": 0.001,
    "router_aux_loss": True,
}
RANKS = 4


@dataclass
class Case:
    """One run's shape: the twin, the entry, the layout and the steps."""

    model: str = "tiny_qwen3"
    entry: str = "pretrain"
    tp: int = 1
    pp: int = 1
    ep: int = 1
    distributed_optimizer: bool = True
    lora: bool = False
    train_iters: int = 6
    save_interval: int = 3
    export_hf: bool = True
    model_overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def data_format(self) -> str:
        return "text" if self.entry == "pretrain" else "alpaca"


def model_view(name: str) -> dict[str, Any]:
    """A model option as recipe.yaml's ``recipe.model`` holds it: the option, and the schema's defaults for what it
    leaves out (rope and norm settings from its transformers config)."""
    option = yaml.safe_load((MODELS / f"{name}.yaml").read_text(encoding="utf-8"))
    config = option.get("config") or {}
    derived = {key: config[key] for key in ("rope_theta", "rms_norm_eps") if key in config}
    return {**MODEL_DEFAULTS, **derived, **option}


def make_bundle(root: Path, case: Case) -> Path:
    """``root``/bundle (recipe.yaml and runtime/) and ``root``/volume (data, output, prepared shards)."""
    bundle, volume = root / "bundle", root / "volume"
    bundle.mkdir(parents=True)
    shutil.copytree(RUNTIME, bundle / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    data = write_tiny_dataset(
        case.data_format, volume / "data" / f"tiny.{'txt' if case.entry == 'pretrain' else 'jsonl'}", n=128
    )
    template = yaml.safe_load(TEMPLATE.read_text(encoding="utf-8"))
    recipe = copy.deepcopy(template["recipe"])
    recipe["model"] = model_view(case.model)
    recipe["mode"] = {"kind": "lora" if case.lora else ("pretrain" if case.entry == "pretrain" else "sft")}
    if case.lora:
        recipe["mode"]["lora"] = {
            "r": 8,
            "alpha": 16,
            "dropout": 0.0,
            "target_modules": "all-linear",
            "merge_on_save": True,
        }
    recipe["data"].update(format=case.data_format, path=str(data), max_len=64, packing=False)
    recipe["cluster"]["mount_path"] = str(volume)
    plan = copy.deepcopy(template["plan"])
    plan.update(prepared_dir=str(volume / "prepared"), world_size=RANKS, run_id="megatron-test")
    document = yaml.safe_load(DOCUMENT.read_text(encoding="utf-8"))
    document["recipekit"].update(entry=case.entry, output_dir=str(volume / "run"), export_hf=case.export_hf)
    document["model"].update(
        tensor_model_parallel_size=case.tp,
        pipeline_model_parallel_size=case.pp,
        expert_model_parallel_size=case.ep,
        **case.model_overrides,
    )
    document["train"].update(train_iters=case.train_iters)
    document["checkpoint"].update(save_interval=case.save_interval)
    document["optimizer"]["use_distributed_optimizer"] = case.distributed_optimizer
    document["ddp"]["use_distributed_optimizer"] = case.distributed_optimizer
    if case.lora:
        document["recipekit"]["entry"] = "finetune"
        document["peft"] = {
            "scheme": "lora",
            "target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
            "dim": 8,
            "alpha": 16,
            "dropout": 0.0,
        }
    text = {"recipe": recipe, "plan": plan, "operations": template["operations"], "megatron": document}
    (bundle / "recipe.yaml").write_text(yaml.safe_dump(text, sort_keys=False), encoding="utf-8")
    (root / "run-key").write_bytes(b"megatron-dry-run-key-0123456789")
    return bundle


def environment(root: Path, hold_at: int | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECIPEKIT_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(
        PYTHONPATH=str(root / "bundle"),
        RECIPEKIT_RUN_KEY_FILE=str(root / "run-key"),
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONWARNINGS="ignore",
        TORCH_NCCL_ASYNC_ERROR_HANDLING="0",
    )
    env[megatroncpu.REDIRECT_ENV] = megatroncpu.__file__
    env[exitcodes.EXIT_DIR_ENV] = str(root / "exit")
    (root / "exit").mkdir(exist_ok=True)
    if hold_at is not None:
        env[exitcodes.HOLD_AT_STEP_ENV] = str(hold_at)
    return env


def start(root: Path, python: Path, *, hold_at: int | None = None, log_name: str = "run.log") -> subprocess.Popen:
    """The room's entry on ``RANKS`` gloo processes, as the launcher starts a pod's workers (niced: shared cores)."""
    argv = [
        "nice", "-n", "10", str(python), "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={RANKS}",
        "-m", "runtime.megatron.train", "--recipe", str(root / "bundle" / "recipe.yaml"), "--resume", "auto",
    ]  # fmt: skip
    log = (root / log_name).open("ab")
    return subprocess.Popen(
        argv, cwd=root / "bundle", env=environment(root, hold_at), stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def metrics(root: Path) -> list[dict[str, Any]]:
    return metricslog.read_records(root / "volume" / "run" / "metrics.jsonl")


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and every process under it (its workers run in sessions of their own, so a process group
    kill misses them; Bridge's checkpoint writers are their children)."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for process in tree:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()
