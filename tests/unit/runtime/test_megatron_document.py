"""recipe.yaml's ``megatron`` document (runtime/boundary/megatronview.py): the example the build side compiles to reads
back whole; unknown keys, wrong types, values outside their choices or floors, and the cross-field rules are each
refused with the key named, all of a document's problems at once."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from recipekit.runtime.boundary.megatronview import (
    ROOM,
    SECTIONS,
    MegatronDoc,
    MegatronDocError,
    check_world,
    read_megatron,
)

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "megatron" / "document.yaml"


@pytest.fixture
def document() -> dict:
    return yaml.safe_load(FIXTURE.read_text(encoding="utf-8"))


def problems(raw: object) -> list[str]:
    with pytest.raises(MegatronDocError) as caught:
        read_megatron(raw)
    return caught.value.problems


def test_the_example_reads_back_with_every_field_it_gives(document: dict) -> None:
    doc = read_megatron(document)
    assert isinstance(doc, MegatronDoc)
    assert (doc.entry, doc.output_dir, doc.export_hf, doc.peft, doc.mixed_precision) == (
        "pretrain",
        "/mnt/shared/runs/tiny-megatron",
        True,
        None,
        None,
    )
    for section, values in document.items():
        if section in SECTIONS:
            assert dict(doc.sections[section]) == values
    assert doc.model_parallel == 4 and doc.data_parallel(8) == 2


def test_lora_reads_into_its_own_type(document: dict) -> None:
    document["recipekit"]["entry"] = "finetune"
    document["peft"] = {"scheme": "lora", "target_modules": ["linear_qkv", "linear_fc1"], "dim": 8, "alpha": 16}
    lora = read_megatron(document).peft
    assert (
        lora is not None and lora.target_modules == ("linear_qkv", "linear_fc1") and (lora.dim, lora.alpha) == (8, 16)
    )
    assert lora.dropout == 0.0


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (
            ("model", "tensor_model_parallel_size"),
            0,
            "megatron.model.tensor_model_parallel_size is 0: expected at least 1",
        ),
        (("model", "tensor_model_parallel_size"), True, "expected int"),
        (("model", "sequence_parallel"), "yes", "megatron.model.sequence_parallel is 'yes': expected bool"),
        (("model", "transformer_impl"), "te", "expected one of transformer_engine, local"),
        (("model", "pipeline_parallel"), 2, "megatron.model.pipeline_parallel is not a field this room sets"),
        (("optimizer", "lr"), "1e-3", "megatron.optimizer.lr is '1e-3': expected float"),
        (("checkpoint", "ckpt_format"), "torch", "expected one of torch_dist"),
        (("dist", "distributed_backend"), "mpi", "expected one of nccl, gloo"),
        (("recipekit", "entry"), "sft", "megatron.recipekit.entry is 'sft': expected one of pretrain, finetune"),
        (("recipekit", "output_dir"), "runs/x", "megatron.recipekit.output_dir is 'runs/x': expected an absolute path"),
    ],
)
def test_a_bad_field_is_named(document: dict, path: tuple[str, str], value: object, expected: str) -> None:
    document[path[0]][path[1]] = value
    found = problems(document)
    assert any(expected in problem for problem in found), found


def test_missing_required_fields_and_unknown_sections_are_all_reported(document: dict) -> None:
    del document["model"]["seq_length"]
    del document["train"]["train_iters"]
    del document["mixed_precision"]
    document["trainer"] = {}
    found = problems(document)
    assert "megatron.model.seq_length is missing" in found
    assert "megatron.train.train_iters is missing" in found
    assert any(p.startswith("megatron.mixed_precision is missing") for p in found)
    assert any(p.startswith("megatron.trainer is not a key of the document") for p in found)
    assert len(found) == 4


def test_every_required_field_of_the_room_and_sections_is_required(document: dict) -> None:
    for section, fields in {"recipekit": ROOM, **SECTIONS}.items():
        for name, spec in fields.items():
            if spec.required:
                broken = copy.deepcopy(document)
                del broken[section][name]
                assert f"megatron.{section}.{name} is missing" in problems(broken)


def test_cross_field_rules(document: dict) -> None:
    document["ddp"]["use_distributed_optimizer"] = False
    document["train"]["global_batch_size"] = 7
    document["model"]["sequence_parallel"] = True
    document["model"]["tensor_model_parallel_size"] = 1
    document["peft"] = {"scheme": "lora", "target_modules": ["linear_qkv"], "dim": 8, "alpha": 8}
    found = problems(document)
    assert any("use_distributed_optimizer differ" in p for p in found)
    assert any("global_batch_size 7 is not a multiple of micro_batch_size 2" in p for p in found)
    assert any("sequence_parallel needs tensor_model_parallel_size > 1" in p for p in found)
    assert any("LoRA finetunes" in p for p in found)


def test_not_a_mapping() -> None:
    assert problems(["model"]) == ["megatron is list: expected a mapping"]
    assert "megatron.peft is 'lora': expected a mapping or null" in problems_with_peft("lora")


def problems_with_peft(peft: object) -> list[str]:
    document = yaml.safe_load(FIXTURE.read_text(encoding="utf-8"))
    document["peft"] = peft
    return problems(document)


def test_the_world_must_fit_the_layout(document: dict) -> None:
    doc = read_megatron(document)
    assert check_world(doc, 4) == []  # TP 2 x PP 2, DP 1: global 8 = micro 2 x 4 micro-batches
    assert check_world(doc, 6) == ["world size 6 is not a multiple of TP × PP × CP = 4"]
    document["model"].update(tensor_model_parallel_size=1, expert_model_parallel_size=4)
    assert check_world(read_megatron(document), 4) == ["world size 4 is not a multiple of EP × ETP × PP = 8"]
    document["model"].update(expert_model_parallel_size=2)
    document["train"].update(global_batch_size=6)
    assert check_world(read_megatron(document), 4) == [
        "global_batch_size 6 is not a multiple of micro_batch_size × data-parallel = 4"
    ]
