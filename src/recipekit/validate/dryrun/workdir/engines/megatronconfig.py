"""The Megatron engine's own argument validation of a bundle's layout, as built (not as the dry run scales it).

The CPU dry run trains the layout scaled to a few gloo processes (TP 8 × PP 16 becomes TP 2 × PP 2; CP, SP and
virtual stages off), so what Megatron-core checks of the real layout would otherwise be checked on a cluster only,
at start-up. recipekit's own rules (:mod:`recipekit.plan.layoutrules`) refuse what it knows of; this is the
engine's word on the same layout: Megatron-core's ``TransformerConfig`` is built in the engine's venv (the one the
dry run's pods use) from the bundle's ``megatron.model`` section and the model's dimensions, and its
``__post_init__`` runs every check it makes of the parallel sizes, the pipeline split, virtual stages, sequence and
expert parallelism, recomputation and the MoE settings. No process group, no weights: a few seconds.

What it cannot judge: the fields of Bridge's GPT provider that are not ``TransformerConfig``'s (``seq_length``,
listed as not checked), and the world: the data-parallel size follows from the Job's pods (the room checks the
world before its process group forms, runtime/boundary/megatronview.py ``check_world``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from recipekit.bundle.files import RECIPE
from recipekit.validate.shared.results import Result

#: In the engine's venv, isolated (-I): TransformerConfig from the fields on stdin (those it has), its verdict.
PROBE = """
import dataclasses, json, sys, torch
from megatron.core.transformer.transformer_config import TransformerConfig
given = json.loads(sys.stdin.read())
names = {field.name for field in dataclasses.fields(TransformerConfig)}
fields = {key: value for key, value in given.items() if key in names and value is not None}
if fields.get("pipeline_model_parallel_size", 1) > 1:
    fields["pipeline_dtype"] = torch.bfloat16  # the document's mixed precision sets it; the check needs one
try:
    TransformerConfig(**fields)
    error = None
except (ValueError, AssertionError, TypeError, NotImplementedError) as exc:
    error = f"{type(exc).__name__}: {exc}"
print(json.dumps({"error": error, "checked": sorted(fields), "not_checked": sorted(set(given) - names)}))
"""
PROBE_TIMEOUT_S = 300


def config_fields(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The model's dimensions as Megatron-core names them, then the document's ``megatron.model`` section (None
    where recipe.yaml has neither)."""
    recipe, megatron = doc.get("recipe"), doc.get("megatron")
    model = recipe.get("model") if isinstance(recipe, dict) else None
    section = megatron.get("model") if isinstance(megatron, dict) else None
    if not isinstance(model, dict) or not isinstance(section, dict):
        return None
    dims = {
        "num_layers": model.get("num_layers"),
        "hidden_size": model.get("hidden_size"),
        "num_attention_heads": model.get("num_attention_heads"),
        "num_query_groups": model.get("num_kv_heads"),
        "ffn_hidden_size": model.get("intermediate_size"),
        "kv_channels": model.get("head_dim_override") or None,
    }
    if model.get("num_experts"):
        dims |= {
            "num_moe_experts": model.get("num_experts"),
            "moe_router_topk": model.get("experts_per_token"),
            "moe_ffn_hidden_size": model.get("moe_intermediate_size"),
        }
    return {**dims, **section}


def check_config(doc: dict[str, Any], python: Path) -> Result:
    """Megatron-core's verdict on the bundle's own layout (see the module's docstring), as validate's result."""
    result = Result("dryrun.engine-config", "dry run: Megatron-core's own checks of the bundle's layout, unscaled")
    fields = config_fields(doc)
    if fields is None:
        return result.skip("recipe.yaml has no recipe.model or megatron.model section")
    try:
        done = subprocess.run(
            [str(python), "-I", "-W", "ignore", "-c", PROBE], input=json.dumps(fields), capture_output=True,
            text=True, timeout=PROBE_TIMEOUT_S, check=False,
        )  # fmt: skip
        verdict = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return result.skip(f"the engine's venv could not be asked ({type(exc).__name__}: {exc})")
    result.details.update(checked=verdict["checked"], not_checked=verdict["not_checked"])
    sizes = ", ".join(
        f"{name} {fields[key]}"
        for name, key in (("TP", "tensor_model_parallel_size"), ("PP", "pipeline_model_parallel_size"),
                          ("EP", "expert_model_parallel_size"), ("CP", "context_parallel_size"))
        if fields.get(key)
    )  # fmt: skip
    if verdict["error"]:
        result.fail(RECIPE, "megatron.model", f"Megatron-core refuses the layout ({sizes}): {verdict['error']}")
    else:
        result.reason = f"TransformerConfig accepts {sizes} and {len(verdict['checked'])} fields as built"
    return result
