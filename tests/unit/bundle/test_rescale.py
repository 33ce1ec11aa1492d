"""Continuing a run on another number of nodes: the global batch kept, the same run id, refusals with arithmetic."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from recipekit.bundle.build import build, resolve
from recipekit.cli import main
from recipekit.plan.layout import Layout
from recipekit.plan.rescale import nodes_keeping_batch, rescale_overrides, rescale_problems, rescaled


def test_overrides_replace_the_node_count_and_pin_the_global_batch() -> None:
    given = ["recipe=llama3_8b_sft", "cluster.nodes=2", "train.gradient_accumulation_steps=4", "train.seed=3"]
    assert rescale_overrides(given, nodes=1, global_batch_size=128) == [
        "recipe=llama3_8b_sft",
        "cluster.nodes=1",
        "train.gradient_accumulation_steps=null",
        "train.seed=3",
        "train.global_batch_size=128",
    ]


def test_the_rescaled_recipe_keeps_the_global_batch_and_raises_accumulation() -> None:
    recipe = resolve(["recipe=llama3_8b_sft", "cluster.nodes=2"]).recipe
    before = resolve(["recipe=llama3_8b_sft", "cluster.nodes=2"]).plan
    target, problems = rescaled(recipe, 1)
    assert problems == []
    assert target.cluster.nodes == 1 and target.train.global_batch_size == before.layout.global_batch_size
    assert target.train.gradient_accumulation_steps is None  # derived from the global batch


def test_a_node_count_the_global_batch_does_not_divide_is_refused_with_the_counts_that_work() -> None:
    layout = Layout(nodes=2, devices_per_pod=8, micro_batch_size=2, gradient_accumulation_steps=4)  # batch 128
    (problem,) = rescale_problems(layout, 3, streaming=False)
    assert problem.key == "--nodes"
    assert "3 cannot keep global batch 128" in problem.message and "= 48" in problem.message
    assert problem.hint == "node counts that keep it: 1, 2, 4, 8"
    assert nodes_keeping_batch(layout, 8) == [1, 2, 4, 8]
    assert rescale_problems(layout, 4, streaming=False) == []


def test_layouts_whose_checkpoints_cannot_be_resharded_are_refused_with_the_reason() -> None:
    from recipekit.plan.rescale import States

    tp = Layout(nodes=2, devices_per_pod=8, tensor_parallel=2)
    (problem,) = rescale_problems(tp, 1, streaming=False)
    assert problem.key == "parallel.tensor_parallel" and "AutoTP" in problem.message
    nvme = States(zero_stage=3, offload_optimizer="nvme", offload_param="nvme")
    (problem,) = rescale_problems(Layout(nodes=2, devices_per_pod=8), 1, streaming=False, states=nvme)
    assert problem.key == "parallel.zero_stage" and "NVMe" in problem.message
    assert rescale_problems(Layout(2, 8), 1, streaming=False, states=States(zero_stage=3)) == []


def test_a_streamed_run_cannot_change_size() -> None:
    layout = Layout(nodes=2, devices_per_pod=1)
    (problem,) = rescale_problems(layout, 1, streaming=True)
    assert problem.key == "data.streaming" and "per rank" in problem.message


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_rescale_writes_the_same_run_on_one_node(tmp_path: Path) -> None:
    source = build(["recipe=tiny_sft"], tmp_path / "two", force=True)
    code, output = run_cli("rescale", str(source.path), "--nodes", "1")
    assert code == 0, output
    target = tmp_path / "two@nodes1"
    plan = yaml.safe_load((target / "recipe.yaml").read_text())["plan"]
    old = source.resolved.plan
    assert plan["run_id"] == old.run_id and plan["job_name"] == old.job_name and plan["output_dir"] == old.output_dir
    assert (plan["nodes"], plan["world_size"], plan["global_batch_size"]) == (1, 1, old.layout.global_batch_size)
    assert plan["gradient_accumulation_steps"] == 2 * old.layout.gradient_accumulation_steps
    job = yaml.safe_load((target / "volcano-job.yaml").read_text())
    assert job["spec"]["minAvailable"] == 1 and job["metadata"]["name"] == old.job_name
    ds = json.loads((target / "ds_config.json").read_text())
    assert ds["gradient_accumulation_steps"] == plan["gradient_accumulation_steps"]
    assert ds["train_batch_size"] == old.layout.global_batch_size
    assert "global batch 4 kept" in output and f"same run {old.run_id}" in output
    assert "re-shards the newest checkpoint's ZeRO-2 partitions" in output
    assert max(len(line) for line in output.splitlines()) <= 80 + len(str(tmp_path))
    assert f"kubectl delete vcjob {old.job_name}" in output
    # the same image: the node count is in the run files and the Job only, so nothing is built
    assert plan["image"] == old.image and "image build" not in output and "nothing to build" in output
    assert f"kubectl apply -k {tmp_path}" in output
    configmap = yaml.safe_load((target / "run-files.yaml").read_text())
    assert configmap["data"]["launch.json"] == (target / "launch.json").read_text()
    assert (target / "Dockerfile").read_bytes() == (source.path / "Dockerfile").read_bytes()
    manifest = json.loads((target / "manifest.json").read_text())
    assert "cluster.nodes=1" in manifest["overrides"]  # `verify` and `diff` rebuild it from its own overrides


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--nodes", "2"), "--nodes: 2: the bundle already runs on 2 node(s)"),
        (("--nodes", "3"), "--nodes: 3 cannot keep global batch 4"),
    ],
)
def test_rescale_refusals_are_one_line_each_exit_2_nothing_written(tmp_path: Path, args, expected) -> None:
    source = build(["recipe=tiny_sft"], tmp_path / "b", force=True)
    code, output = run_cli("rescale", str(source.path), *args)
    assert code == 2 and expected in output and "Traceback" not in output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_a_rebuild_that_would_be_another_run_is_refused(tmp_path: Path) -> None:
    source = build(["recipe=tiny_sft"], tmp_path / "b", force=True)
    manifest = json.loads((source.path / "manifest.json").read_text())
    manifest["overrides"].append("train.learning_rate=0.5")  # the tree the bundle came from has changed
    (source.path / "manifest.json").write_text(json.dumps(manifest))
    code, output = run_cli("rescale", str(source.path), "--nodes", "1")
    assert code == 2 and "would start another run instead of continuing this one" in output
    assert not (tmp_path / "b@nodes1").exists()


def test_a_directory_that_is_no_bundle_is_one_line(tmp_path: Path) -> None:
    code, output = run_cli("rescale", str(tmp_path), "--nodes", "1")
    assert code == 2 and "manifest.json: cannot be read" in output and "Traceback" not in output
    os.mkfifo(tmp_path / "manifest.json")  # a shared volume's FIFO is refused, not read (it would block)
    code, output = run_cli("rescale", str(tmp_path), "--nodes", "1")
    assert code == 2 and "is not a regular file" in output


@pytest.mark.parametrize(
    "override",
    [
        "cluster.output_dir=/mnt/shared/elsewhere",
        "cluster.mount_path=/mnt/other",
        "cluster.namespace=another-team",
        "cluster.pvc_claim=another-claim",
    ],
)
def test_a_manifest_that_moves_the_run_is_refused(tmp_path: Path, override: str) -> None:
    """The run id does not cover where the run lives: an edited manifest would rebuild a Job whose checkpoints are
    looked for elsewhere, under the same id."""
    source = build(["recipe=tiny_sft"], tmp_path / "b", force=True)
    manifest = json.loads((source.path / "manifest.json").read_text())
    manifest["overrides"].append(override)
    (source.path / "manifest.json").write_text(json.dumps(manifest))
    code, output = run_cli("rescale", str(source.path), "--nodes", "1")
    key = override.split("=")[0]
    moved = f"the rebuild's recipe.{key} is" in output and "keeps the run where it is" in output
    assert code == 2 and (moved or "would start another run" in output), output  # the id covers some of them
    assert "Traceback" not in output and not (tmp_path / "b@nodes1").exists()


def test_the_node_search_is_bounded_by_the_schemas_node_limit() -> None:
    from recipekit.plan.rescale import MAX_NODES

    assert MAX_NODES == 4096  # cluster.nodes' bound in the schema
    huge = Layout(nodes=10**12, devices_per_pod=1, micro_batch_size=3)
    (problem,) = rescale_problems(huge, 1, streaming=False)
    assert problem.key == "plan.nodes" and f"from 1 to {MAX_NODES}" in problem.message
    assert max(nodes_keeping_batch(Layout(nodes=MAX_NODES, devices_per_pod=1), limit=10**12)) == MAX_NODES
