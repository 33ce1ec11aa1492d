"""The golden bundles: each preset as shipped, plus the variants whose files really differ (CUDA, CPU, LoRA)."""

from __future__ import annotations

from pathlib import Path

from recipekit.bundle.files import runtime_files
from recipekit.recipe.compose import group_options

GOLDEN_DIR = Path(__file__).parent / "bundles"
#: Files copied verbatim from src/recipekit/runtime: tested on their own, hashed in manifest.json.
UNCHECKED = frozenset(runtime_files("trainer")) | frozenset(runtime_files("megatron"))


def cases() -> dict[str, list[str]]:
    """Case name → overrides. Every preset in recipes/recipe/, discovered from disk, plus a few hardware variants."""
    found = {preset: [f"recipe={preset}"] for preset in group_options("recipe")}
    found["llama3_8b_lora@a100_80g"] = ["recipe=llama3_8b_lora", "hw=a100_80g"]
    found["llama3_8b_sft@h100_offload"] = ["recipe=llama3_8b_sft", "hw=h100", "parallel=zero3_offload"]
    # QLoRA where a bitsandbytes exists: Ascend has none that transformers accepts (a build error there)
    found["qwen2.5_7b_qlora@h100"] = ["model=qwen2.5_7b", "mode=qlora", "parallel=zero2", "hw=h100"]
    return found
