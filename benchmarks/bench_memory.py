"""Measured peak device memory of a few real training steps against recipekit's prediction, and how long
``estimate()`` and ``advise()`` take.

Run from the repository root: ``.venv/bin/python benchmarks/bench_memory.py``. Where no CUDA (or Ascend NPU) device is
present the measurement prints ``skipped: no accelerator`` and the script still exits 0.

What is compared: the bundle's no-DeepSpeed path (``parallel=ddp`` on one device, so no DDP bucket copy), i.e. an
fp32 Llama/Qwen2 built from its config, the Trainer's bf16 autocast, fused AdamW, gradients set to None between
steps. ``max_memory_allocated`` over steps 2-3 (step 1 creates the optimizer states) against the estimate's items
minus the framework overhead (context and allocator slack are invisible to ``max_memory_allocated``) and the ZeRO
buffers (none without DeepSpeed). Goal: within ±15%. The estimate sums its items; in a real step activations are
freed as backward creates gradients, so the prediction should come out a little high, never far low.
"""

from __future__ import annotations

import datetime
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from recipekit.image.matrix import load_images  # noqa: E402
from recipekit.memory import advise, estimate  # noqa: E402
from recipekit.plan.plan import make_plan  # noqa: E402
from recipekit.recipe.compose import compose  # noqa: E402
from recipekit.recipe.paralleloptions import load_parallel_options  # noqa: E402
from recipekit.recipe.sections import parse_recipe  # noqa: E402

#: Within this relative error the prediction counts as on target.
GOAL = 0.15
#: Steps run; the peak is taken over all but the first, which allocates the optimizer states.
STEPS = 3
#: The Llama twin widened to 156M parameters (the model part of two configurations below).
LLAMA_156M = [
    "model=tiny_llama",
    "model.hidden_size=1024",
    "model.intermediate_size=2816",
    "model.num_layers=8",
    "model.num_attention_heads=16",
    "model.num_kv_heads=4",
    "model.vocab_size=32000",
    "model.max_position_embeddings=4096",
    "data.max_len=1024",
]
#: Small configurations: (label, overrides). Each fits a 40 GB device with room to spare.
CONFIGS = [
    (
        "llama 156M, micro 4 × 1024, no checkpointing",
        [*LLAMA_156M, "train.micro_batch_size=4", "parallel.gradient_checkpointing=false"],
    ),
    (
        "llama 156M, micro 8 × 1024, checkpointing",
        [*LLAMA_156M, "train.micro_batch_size=8", "parallel.gradient_checkpointing=true"],
    ),
    (
        "qwen2 391M, micro 2 × 2048, no checkpointing",
        [
            "model=tiny_qwen2",
            "model.hidden_size=1536",
            "model.intermediate_size=4096",
            "model.num_layers=12",
            "model.num_attention_heads=12",
            "model.num_kv_heads=2",
            "model.vocab_size=32000",
            "model.max_position_embeddings=4096",
            "data.max_len=2048",
            "train.micro_batch_size=2",
            "parallel.gradient_checkpointing=false",
        ],
    ),
]
#: One device, the bundle's plain-DDP path, a global batch of one micro-batch.
COMMON = [
    "mode=sft",
    "parallel=ddp",
    "cluster.nodes=1",
    "cluster.devices_per_pod=1",
    "train.precision=bf16",
    "train.gradient_accumulation_steps=1",
    "train.max_steps=10",
]
#: Recipe hardware per device name; anything else is measured as an h100 with the device's own memory.
HW_BY_NAME = {"H100": "h100", "H200": "h200", "H800": "h800", "A100": "a100_80g", "910": "ascend910b"}


def _timed(fn, repeat: int) -> tuple[float, object]:
    start = time.perf_counter()
    for _ in range(repeat):
        result = fn()
    return (time.perf_counter() - start) / repeat, result


def time_estimators() -> None:
    images, options = load_images(), load_parallel_options()
    recipe = parse_recipe(compose(["recipe=qwen2.5_14b_sft"]).raw)
    plan = make_plan(recipe, images, analysis_only=True)
    per_estimate, _ = _timed(lambda: estimate(recipe, plan), 200)
    per_advise, advices = _timed(lambda: advise(recipe, images, parallel_options=options), 3)
    per_search, _ = _timed(lambda: advise(recipe, images, parallel_options=options, search_pp=True), 1)
    print(
        f"estimate(): {per_estimate * 1e3:.2f} ms   advise(): {per_advise * 1e3:.0f} ms "
        f"({len(advices)} advised)   advise(search_pp=True): {per_search * 1e3:.0f} ms   [qwen2.5_14b_sft]"
    )


def _accelerator():
    """(torch module for the device, autocast device type, device name) or None."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda, "cuda", torch.cuda.get_device_name(0)
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        return None
    if torch.npu.is_available():
        return torch.npu, "npu", torch.npu.get_device_name(0)
    return None


def measure(label: str, overrides: list[str], accel, device_type: str, device_name: str) -> bool:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hw = next((hw for key, hw in HW_BY_NAME.items() if key in device_name), "h100")
    total_gib = accel.get_device_properties(0).total_memory / 2**30
    recipe = parse_recipe(compose([*overrides, *COMMON, f"hw={hw}", f"hw.memory_gib={total_gib:.1f}"]).raw)
    est = estimate(recipe, make_plan(recipe, load_images(), analysis_only=True))
    predicted = sum(item.gib for item in est.memory if item.name not in ("framework overhead", "ZeRO buffers"))

    m = recipe.model
    config = AutoConfig.for_model(
        m.family,
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_kv_heads,
        vocab_size=m.vocab_size,
        max_position_embeddings=m.max_position_embeddings,
        tie_word_embeddings=m.tie_word_embeddings,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(device_type)  # fp32: AMP without DeepSpeed
    if recipe.parallel.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device_type == "cuda")
    ids = torch.randint(0, m.vocab_size, (recipe.train.micro_batch_size, recipe.data.max_len), device=device_type)
    for step in range(STEPS):
        if step == 1:
            accel.synchronize()
            accel.reset_peak_memory_stats()
        with torch.autocast(device_type, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    accel.synchronize()
    measured = accel.max_memory_allocated() / 2**30
    error = predicted / measured - 1
    ok = abs(error) <= GOAL
    print(
        f"  {label}: measured {measured:.2f} GiB, predicted {predicted:.2f} GiB ({error:+.1%}) {'ok' if ok else 'MISS'}"
    )
    items = ", ".join(
        f"{item.name} {item.gib:.2f}" for item in est.memory if item.name not in ("framework overhead", "ZeRO buffers")
    )
    print(f"    predicted items (GiB): {items}")
    del model, optimizer, loss
    accel.empty_cache()
    return ok


def main() -> int:
    print(
        f"recipekit memory benchmark, {datetime.datetime.now().isoformat(timespec='seconds')}, "
        f"{platform.node()}, Python {platform.python_version()}"
    )
    time_estimators()
    try:
        import torch  # noqa: F401
    except ImportError:
        print("measurement skipped: no accelerator (torch is not installed)")
        return 0
    found = _accelerator()
    if found is None:
        print("measurement skipped: no accelerator (no CUDA or Ascend NPU device visible)")
        return 0
    accel, device_type, device_name = found
    print(f"device: {device_name} ({device_type}), torch {torch.__version__}")
    results = [measure(label, overrides, accel, device_type, device_name) for label, overrides in CONFIGS]
    print(f"{sum(results)}/{len(results)} within ±{GOAL:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
