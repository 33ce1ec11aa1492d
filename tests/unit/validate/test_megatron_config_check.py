"""The Megatron engine's own argument validation of a bundle's layout as built (validate/dryrun/workdir/engines/
megatronconfig.py): Megatron-core's TransformerConfig, in the engine's venv, from recipe.yaml's megatron.model section
and the model's dimensions. The dry run scales the layout down to train it; this is the unscaled layout's check.
Slow where it asks the engine (its venv: the one the Megatron dry runs build)."""

from __future__ import annotations

import copy

import pytest
import yaml

from recipekit.validate.dryrun.workdir.engines.megatronconfig import check_config, config_fields
from recipekit.validate.shared.results import Status
from tests.conftest import render_files

#: Llama 3 70B pretraining at TP 8 × PP 4 with 2 virtual stages and sequence parallelism, on 8 nodes of 8.
LAYOUT = [
    "recipe=llama3_70b_pretrain", "engine=megatron", "parallel=distopt", "parallel.tensor_parallel=8",
    "parallel.pipeline_parallel=4", "parallel.virtual_pipeline_stages=2", "parallel.sequence_parallel=true",
    "cluster.nodes=8",
]  # fmt: skip


@pytest.fixture(scope="module")
def doc() -> dict:
    return yaml.safe_load(render_files(LAYOUT, allow_oom=True)["recipe.yaml"])


def test_the_model_s_dimensions_are_named_as_megatron_core_names_them(doc: dict) -> None:
    fields = config_fields(doc)
    assert fields is not None
    assert (fields["num_layers"], fields["hidden_size"], fields["num_query_groups"]) == (80, 8192, 8)
    assert fields["tensor_model_parallel_size"] == 8 and fields["virtual_pipeline_model_parallel_size"] == 2
    assert config_fields({"recipe": {}}) is None


@pytest.mark.slow
def test_megatron_core_accepts_the_layout_as_built_and_names_what_it_refuses(doc: dict) -> None:
    from recipekit.validate.dryrun.workdir.enginevenv import engine_python

    python = engine_python()
    accepted = check_config(doc, python)
    assert accepted.status is Status.PASS, accepted.findings
    assert "TP 8, PP 4" in accepted.reason and "sequence_parallel" in accepted.details["checked"]
    assert accepted.details["not_checked"] == ["seq_length"]  # a field of Bridge's provider, not of the config

    edited = copy.deepcopy(doc)  # a document edited by hand: an edge stage Megatron-core cannot split the rest for
    edited["megatron"]["model"]["num_layers_in_first_pipeline_stage"] = 19
    refused = check_config(edited, python)
    assert refused.status is Status.FAIL
    (finding,) = refused.findings
    assert finding.field == "megatron.model" and "Megatron-core refuses the layout (TP 8, PP 4" in finding.message
    assert "ValueError" in finding.message or "AssertionError" in finding.message
