"""Pipeline stages of their own length for the Megatron engine: ``parallel.first_stage_layers`` and
``last_stage_layers`` are compiled into the room's document as Megatron-core's ``num_layers_in_first_pipeline_stage``
and ``num_layers_in_last_pipeline_stage``, and the plan's split (layoutrules.stage_layers) is Megatron-core's own:
checked in the engine's venv with ``TransformerConfig`` and ``get_num_layers_to_build`` for every pipeline rank
(slow: the venv the Megatron dry runs use)."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from recipekit.bundle.build import resolve
from recipekit.plan.layoutrules import stage_layers
from tests.conftest import render_files

#: Llama 3 70B's 80 layers (Llama 3 paper, Table 3) over 6 stages: a first stage of 15, the rest 13 each; over 4 with
#: a first and a last of 19 (21 each between); a Megatron run at TP 8 on 12 and 8 nodes of 8 devices.
PP6_FIRST_15 = ["parallel.pipeline_parallel=6", "parallel.first_stage_layers=15", "cluster.nodes=12"]
PP4_EDGES_19 = ["parallel.pipeline_parallel=4", "parallel.first_stage_layers=19", "parallel.last_stage_layers=19"]
CASES = {
    "first": (PP6_FIRST_15, (15, 13, 13, 13, 13, 13)),
    "first and last": ([*PP4_EDGES_19, "cluster.nodes=8"], (19, 21, 21, 19)),
}
BASE = ["recipe=llama3_70b_pretrain", "engine=megatron", "parallel=distopt", "parallel.tensor_parallel=8"]

#: In the engine's venv: Megatron-core's config from the document's pipeline fields, and the layers it builds on each
#: pipeline rank (its own function; no process group needed with pp_rank given).
PROBE = """
import json, sys, torch
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_block import get_num_layers_to_build
fields = json.loads(sys.argv[1])
config = TransformerConfig(hidden_size=64, num_attention_heads=8, pipeline_dtype=torch.bfloat16, **fields)
print(json.dumps([get_num_layers_to_build(config, pp_rank=r) for r in range(config.pipeline_model_parallel_size)]))
"""
PIPELINE_FIELDS = (
    "pipeline_model_parallel_size",
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
)


def document_model(overrides: list[str]) -> dict:
    recipe = yaml.safe_load(render_files([*BASE, *overrides], allow_oom=True)["recipe.yaml"])
    return recipe["megatron"]["model"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_edge_stages_are_compiled_into_the_document(case: str) -> None:
    overrides, split = CASES[case]
    model = document_model(overrides)
    first, last = split[0], split[-1]
    assert model["num_layers_in_first_pipeline_stage"] == first
    assert model.get("num_layers_in_last_pipeline_stage") == (last if "last" in case else None)
    assert stage_layers(80, resolve([*BASE, *overrides], analysis_only=True).plan.layout) == split


def test_an_even_split_carries_no_edge_fields() -> None:
    model = document_model(["parallel.pipeline_parallel=4", "cluster.nodes=4"])
    assert "num_layers_in_first_pipeline_stage" not in model and "num_layers_in_last_pipeline_stage" not in model


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_plan_s_split_is_megatron_core_s_own(case: str) -> None:
    from recipekit.validate.dryrun.workdir.enginevenv import engine_python

    overrides, split = CASES[case]
    model = document_model(overrides)
    fields = {"num_layers": 80, **{key: model[key] for key in PIPELINE_FIELDS if key in model}}
    done = subprocess.run(
        [str(engine_python()), "-W", "ignore", "-c", PROBE, json.dumps(fields)], capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert tuple(json.loads(done.stdout.strip().splitlines()[-1])) == split
