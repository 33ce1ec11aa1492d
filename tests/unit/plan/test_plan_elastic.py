"""An elastic run (``cluster.min_nodes``): the accumulation that keeps the global batch at every size it may continue
on, decided at build, and every size it could not continue on refused at build with its arithmetic."""

from __future__ import annotations

import pytest

from recipekit.base.errors import RecipeError
from recipekit.bundle.build import resolve
from recipekit.plan.rescale import layout_at
from tests.conftest import documents_of


def messages_of(*overrides: str) -> list[str]:
    with pytest.raises(RecipeError) as info:
        resolve(list(overrides))
    return [str(p) for p in info.value.problems if p.key == "cluster.min_nodes"]


def test_every_size_keeps_the_global_batch_with_its_own_accumulation() -> None:
    resolved = resolve(["recipe=tiny_sft", "parallel=ddp", "cluster.nodes=4", "cluster.min_nodes=2",
                        "train.global_batch_size=24", "train.gradient_accumulation_steps=null"])  # fmt: skip
    plan = resolved.plan
    assert plan.elastic is not None and (plan.elastic.min_nodes, plan.elastic.max_nodes) == (2, 4)
    layout = plan.layout
    for nodes in (2, 3, 4):
        at, problems = layout_at(layout, nodes)
        assert not problems and at.global_batch_size == layout.global_batch_size == 24
        assert plan.elastic.accumulation[at.world_size] == at.gradient_accumulation_steps
    assert plan.elastic.accumulation[layout.world_size] == layout.gradient_accumulation_steps
    rows = plan.summary()["elastic"]["accumulation"]
    assert [r["world_size"] for r in rows] == sorted(plan.elastic.accumulation)


def test_a_size_that_cannot_keep_the_batch_is_refused_with_its_arithmetic() -> None:
    """3 pods of 1 rank cannot hold a global batch of 16 in whole micro-batches of 2: the run could not continue
    there, so the build says so instead of the cluster finding out."""
    found = messages_of("recipe=tiny_sft", "parallel=ddp", "cluster.nodes=4", "cluster.min_nodes=2",
                        "train.global_batch_size=16", "train.gradient_accumulation_steps=null")  # fmt: skip
    assert found and all("on 3 node(s)" in m and "16" in m for m in found), found


def test_what_no_size_can_continue_is_said_once() -> None:
    found = messages_of("recipe=tiny_sft", "cluster.nodes=4", "cluster.min_nodes=1", "data.streaming=true")
    assert sum("data.streaming" in m for m in found) == 1, found


def test_min_nodes_above_nodes_and_the_megatron_engine_are_refused() -> None:
    (above,) = messages_of("recipe=tiny_sft", "cluster.nodes=2", "cluster.min_nodes=3")
    assert "more than cluster.nodes (2)" in above
    found = messages_of("recipe=tiny_sft", "engine=megatron", "parallel=distopt", "cluster.min_nodes=1")
    assert any("megatron engine" in m for m in found), found


def test_the_job_and_launch_json_of_an_elastic_bundle() -> None:
    """The gang is the fewest pods and the rendezvous pod, an evicted pod's replacement is left to Volcano (no
    RestartJob), the Job completes once its fewest pods succeeded, and the launcher gets the range, the restart
    budget and the rendezvous task."""
    docs = documents_of(resolve(["recipe=tiny_sft", "parallel=ddp", "cluster.nodes=2", "cluster.min_nodes=1"]))
    spec = docs.job["spec"]
    workers, rendezvous = spec["tasks"]
    assert (spec["minAvailable"], spec["minSuccess"], workers["replicas"], workers["minAvailable"]) == (2, 1, 2, 1)
    events = [p.get("event") for p in spec["policies"]]
    assert "PodEvicted" not in events and "PodFailed" in events
    assert docs.launch["elastic"] == {
        "min_nodes": 1,
        "max_restarts": spec["maxRetry"],
        "last_call_s": 30,
        "rendezvous": {"task_name": "rdzv", "task_env": "RDZV"},
    }
    assert (rendezvous["name"], rendezvous["replicas"], rendezvous["minAvailable"]) == ("rdzv", 1, 1)
    server = rendezvous["template"]["spec"]["containers"][0]
    trainer = workers["template"]["spec"]["containers"][0]
    assert server["command"] == trainer["command"] and server["args"] == ["--serve-rendezvous"]
    assert server["image"] == trainer["image"] and server["ports"][0]["containerPort"] == docs.launch["master_port"]
    assert set(server["resources"]["limits"]) == {"cpu", "memory"}  # no device
    assert [m["mountPath"] for m in server["volumeMounts"]] == ["/workspace/run"]  # no volume, no run key
    npu = documents_of(resolve(["recipe=llama3_8b_sft", "hw=ascend910b", "cluster.nodes=2", "cluster.min_nodes=1"]))
    npu_workers, npu_server = (task["template"] for task in npu.job["spec"]["tasks"])
    assert "huawei.com/Ascend910" in npu_workers["spec"]["containers"][0]["resources"]["limits"]
    assert "huawei.com/Ascend910" not in npu_server["spec"]["containers"][0]["resources"]["limits"]
    assert "ring-controller.atlas" in npu_workers["metadata"]["labels"]
    assert "ring-controller.atlas" not in npu_server["metadata"]["labels"]  # MindCluster's: the trainers' alone


def test_the_training_task_cannot_take_the_rendezvous_tasks_name() -> None:
    with pytest.raises(RecipeError) as info:
        resolve(["recipe=tiny_sft", "cluster.nodes=2", "cluster.min_nodes=1", "cluster.task_name=rdzv"])
    assert any(p.key == "cluster.task_name" and "rendezvous pod" in str(p) for p in info.value.problems)
    assert resolve(["recipe=tiny_sft", "cluster.nodes=2", "cluster.task_name=rdzv"]).plan.task_name == "rdzv"
    gang = documents_of(resolve(["recipe=tiny_sft", "parallel=ddp", "cluster.nodes=2"]))
    assert gang.job["spec"]["minAvailable"] == 2 and "minSuccess" not in gang.job["spec"]
    assert "elastic" not in gang.launch
    assert "PodEvicted" in [p.get("event") for p in gang.job["spec"]["policies"]]
