"""The Megatron engine's dry run, without running it: the layout scaled to the simulated pods, the CPU edits of the
megatron document, what its pods get, where the judges read the room's checkpoints, what validate says is not proven,
and the static rules of consistency.megatron. (The runs themselves: tests/integration/test_megatron_engine.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipekit.bundle.build import build, resolve
from recipekit.bundle.engines.megatron import MegatronBundle
from recipekit.runtime.boundary import filenames
from recipekit.runtime.boundary.megatronview import read_megatron
from recipekit.validate.dryrun.options import DryRunOptions, DryRunUsageError
from recipekit.validate.dryrun.workdir import megatroncpu
from recipekit.validate.dryrun.workdir.engines import dryrun_engine, engine_of_doc
from recipekit.validate.dryrun.workdir.engines.megatron import CPU_MODEL, NOT_PROVEN
from recipekit.validate.dryrun.workdir.substitutions import substitute
from recipekit.validate.shared.loader import load_bundle
from recipekit.validate.shared.results import Status
from recipekit.validate.static.megatronlayout import check_megatron_layout

MEGATRON = ["engine=megatron", "parallel=distopt"]
ENGINE = dryrun_engine("megatron")


def substituted(tmp_path: Path, *overrides: str, pods: int = 2, procs: int = 2):
    resolved = resolve([*MEGATRON, *overrides])
    return substitute(resolved.recipe, DryRunOptions(pods=pods, procs_per_pod=procs), tmp_path)


def test_the_engine_is_asked_by_the_bundles_recipe() -> None:
    assert engine_of_doc({"recipe": {"engine": {"kind": "megatron"}}}).kind == "megatron"
    assert engine_of_doc({"recipe": {}}).kind == "trainer"  # a bundle from before the seam
    assert engine_of_doc(None).kind == "trainer"


def test_a_3d_layout_is_scaled_to_two_of_each_split_with_the_reasons(tmp_path: Path) -> None:
    dry, subs = substituted(
        tmp_path,
        "recipe=llama3_70b_sft",
        "cluster.nodes=4",
        "parallel.tensor_parallel=4",
        "parallel.sequence_parallel=true",
        "parallel.pipeline_parallel=8",
        "parallel.virtual_pipeline_stages=2",
        "train.micro_batch_size=1",
    )
    par = dry.parallel
    assert (par.tensor_parallel, par.pipeline_parallel, par.virtual_pipeline_stages) == (2, 2, 2)
    assert not par.sequence_parallel and dry.train.precision == "fp32"
    # the interleaved schedule's four model chunks each hold whole layers of the twin (hand-made with 2)
    assert dry.model.num_layers == 4 and dry.model.config["num_hidden_layers"] == 4
    assert "the twin gets 4" in {s.field: s for s in subs}["recipe.model.num_layers"].why
    fields = {s.field: s for s in subs}
    assert (
        fields["recipe.parallel.tensor_parallel"].old == 4 and "scaled" in fields["recipe.parallel.tensor_parallel"].why
    )
    assert "Transformer Engine" in fields["recipe.parallel.sequence_parallel"].why
    assert dry.model.family == "llama" and dry.model.init == "random"  # the twin, whole heads for TP 2


def test_tp_with_ep_becomes_ep_alone_and_lora_trains_without_dropout(tmp_path: Path) -> None:
    dry, subs = substituted(
        tmp_path,
        "recipe=qwen3_30b_a3b_lora",
        "parallel.expert_parallel=4",
        "parallel.tensor_parallel=2",
        "parallel.sequence_parallel=true",
        "mode.lora.dropout=0.1",
    )
    assert (dry.parallel.tensor_parallel, dry.parallel.expert_parallel) == (1, 2)
    assert dry.mode.lora.dropout == 0.0
    assert any(s.field == "recipe.mode.lora.dropout" and "dropout masks" in s.why for s in subs)


def test_a_world_too_small_for_the_scaled_layout_names_the_flags(tmp_path: Path) -> None:
    with pytest.raises(DryRunUsageError, match="needs a multiple of 4 processes.*--procs-per-pod 2"):
        substituted(
            tmp_path, "recipe=llama3_8b_sft", "parallel.tensor_parallel=2", "parallel.pipeline_parallel=2", procs=1
        )


def test_the_cpu_edits_of_the_document_are_read_by_the_rooms_own_reader() -> None:
    resolved = resolve([*MEGATRON, "recipe=qwen3_30b_a3b_lora", "parallel.expert_parallel=4"])
    engine = MegatronBundle().documents(resolved.recipe, resolved.plan)
    edited, subs = ENGINE.edit(engine, "cpu")
    doc = edited.recipe_sections["megatron"]
    read_megatron(doc)  # the room takes it
    assert {k: doc["model"][k] for k in CPU_MODEL} == CPU_MODEL
    assert doc["model"]["moe_grouped_gemm"] is False and doc["dist"]["distributed_backend"] == "gloo"
    assert doc["recipekit"]["export_hf"] is False  # an MoE twin is not exported on the CPU, said why
    assert {s.field for s in subs} >= {"megatron.dist.distributed_backend", "megatron.recipekit.export_hf"}
    assert engine.recipe_sections["megatron"]["dist"]["distributed_backend"] == "nccl"  # the bundle's own: unchanged
    assert ENGINE.edit(engine, "cuda") == (engine, [])  # a real device runs the document as built


def test_the_pods_get_the_engine_venv_first_and_the_redirect(monkeypatch: pytest.MonkeyPatch) -> None:
    from recipekit.validate.dryrun.workdir import enginevenv

    monkeypatch.setattr(enginevenv, "engine_python", lambda progress=None: Path("/venvs/engine/bin/python"))
    env = ENGINE.pod_environment(DryRunOptions(), {"PATH": "/usr/bin"})
    assert env["PATH"] == "/venvs/engine/bin:/usr/bin" and env["OMP_NUM_THREADS"] == "1"
    assert env[megatroncpu.REDIRECT_ENV] == str(Path(megatroncpu.__file__).resolve())
    assert megatroncpu.REDIRECT_ENV not in ENGINE.pod_environment(DryRunOptions(device="cuda"), {"PATH": "/usr/bin"})


def test_the_judges_read_the_rooms_signed_checkpoints_and_brigdes_tracker(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    for step, signed in ((3, True), (6, True), (9, False)):
        directory = checkpoints / f"iter_{step:07d}"
        directory.mkdir(parents=True)
        if signed:
            (directory / filenames.RUN_FILE).write_text(json.dumps({"step": step}))
    (checkpoints / "iter_0000012").symlink_to(checkpoints / "iter_0000006")  # planted: never counted
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("9\n")
    assert ENGINE.checkpoints(tmp_path) == [3, 6]  # iter 9 never signed: the room passes it over
    assert ENGINE.resume_step(tmp_path) == 6
    assert ENGINE.final_step(tmp_path) == 9
    assert ENGINE.final_weights(tmp_path) == []
    assert ENGINE.exports_weights({"megatron": {"recipekit": {"export_hf": False}}}) is False


def test_validate_lists_what_the_cpu_run_does_not_prove(tmp_path: Path) -> None:
    built = build(
        [*MEGATRON, "recipe=llama3_70b_sft", "cluster.nodes=4", "parallel.tensor_parallel=4"]
        + ["parallel.pipeline_parallel=8", "parallel.virtual_pipeline_stages=2", "train.micro_batch_size=1"]
        + ["parallel.sequence_parallel=true"],
        tmp_path / "b",
        allow_oom=True,
    )
    items = ENGINE.not_proven(load_bundle(built.path))
    assert items[: len(NOT_PROVEN)] == list(NOT_PROVEN)
    assert any("sequence parallelism" in item for item in items)  # the recipe's, which the dry run leaves out
    assert not any("virtual pipeline" in item for item in items)  # the dry run trains them
    # the image's Megatron stack pins the dry run's Megatron-Bridge and megatron-core (images/matrix.yaml engines)
    assert not any("pins no Megatron-Bridge" in item or "image's engine version" in item for item in items)
    assert dryrun_engine("trainer").not_proven(load_bundle(built.path)) == []


def test_consistency_megatron_passes_a_built_bundle_and_names_a_broken_document(tmp_path: Path) -> None:
    built = build([*MEGATRON, "recipe=llama3_8b_sft", "parallel.pipeline_parallel=2"], tmp_path / "b", allow_oom=True)
    bundle = load_bundle(built.path)
    assert not bundle.parse_findings, bundle.parse_findings  # no training_arguments asked of it
    assert check_megatron_layout(bundle).status is Status.PASS
    model = bundle.doc["megatron"]["model"]
    model["tensor_model_parallel_size"] = 3
    model["pipeline_model_parallel_size"] = 3
    messages = " | ".join(f.message for f in check_megatron_layout(bundle).findings)
    assert "not a multiple of TP × PP × CP = 9" in messages
    assert "TP 3 does not divide the 8 devices of a pod" in messages
    assert "does not divide Llama-3-8B" in messages or "attention" in messages
    assert "PP 3 × 1 virtual stage(s) does not divide" in messages
    trainer = load_bundle(build(["recipe=tiny_sft"], tmp_path / "t").path)
    assert check_megatron_layout(trainer).status is Status.SKIP


def test_a_deepened_twin_continues_its_per_layer_pattern() -> None:
    """A twin whose config names each layer's kind keeps its pattern when deepened for the model chunks."""
    from recipekit.validate.dryrun.workdir.twinmodel import config_with_depth

    config = {"num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"], "mlp_only_layers": [0, 1]}
    deeper = config_with_depth(config, 6)
    assert deeper is not None and deeper["num_hidden_layers"] == 6
    assert deeper["layer_types"] == ["sliding_attention", "full_attention"] * 3
    assert deeper["mlp_only_layers"] == [0, 1]  # layer indices, not one kind a layer: left as they are
    assert config["num_hidden_layers"] == 2  # the option's own mapping is not changed
