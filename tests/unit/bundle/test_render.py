"""Rendered bundles: deterministic, consistent across files, and clean under the linters."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recipekit.base.errors import RecipeError
from recipekit.bundle.build import build
from recipekit.bundle.write import is_bundle
from tests.conftest import render_files

_BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    found = shutil.which(name) or (str(_BIN / name) if (_BIN / name).exists() else None)
    if not found:
        pytest.skip(f"{name} not installed (pip install '.[test]')")
    return found


def test_same_inputs_give_byte_identical_bundles(tmp_path: Path) -> None:
    first = build(["recipe=qwen2.5_14b_sft"], tmp_path / "a")
    build(["recipe=qwen2.5_14b_sft"], tmp_path / "b")
    for name in first.files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert (tmp_path / "a" / "run.sh").stat().st_mode & 0o777 == 0o755


def test_manifest_records_hashes_choices_and_versions() -> None:
    files = render_files(["recipe=llama3_8b_lora", "hw=a100_80g"])
    manifest = json.loads(files["manifest.json"])
    import hashlib

    assert manifest["files"] == {n: hashlib.sha256(d).hexdigest() for n, d in files.items() if n != "manifest.json"}
    assert manifest["choices"]["hw"] == "a100_80g" and manifest["overrides"] == ["recipe=llama3_8b_lora", "hw=a100_80g"]
    assert manifest["versions"]["transformers"] and manifest["versions"]["torch"]


def test_numbers_agree_across_files() -> None:
    files = render_files(["recipe=qwen2.5_14b_sft"])
    job = yaml.safe_load(files["volcano-job.yaml"])
    recipe = yaml.safe_load(files["recipe.yaml"])
    launch = json.loads(files["launch.json"])
    task = job["spec"]["tasks"][0]
    container = task["template"]["spec"]["containers"][0]
    devices = int(container["resources"]["limits"]["huawei.com/Ascend910"])
    assert task["replicas"] * devices == recipe["plan"]["world_size"] == 16
    assert (launch["nodes"], launch["nproc_per_node"]) == (task["replicas"], devices)
    assert launch["master_port"] == container["ports"][0]["containerPort"] == recipe["plan"]["master_port"]
    assert launch["task_name"] == task["name"] and launch["task_env"] == "WORKER"
    assert launch["job_name"] == job["metadata"]["name"] == recipe["plan"]["job_name"]
    assert job["spec"]["plugins"] == {"env": [], "svc": ["--publish-not-ready-addresses"]}
    assert job["spec"]["minAvailable"] == task["replicas"]
    assert container["image"] == recipe["plan"]["image"]


def test_ascend_job_and_script_have_what_910b_needs() -> None:
    files = render_files(["recipe=llama3_8b_sft", "hw=ascend910b"])
    job = yaml.safe_load(files["volcano-job.yaml"])
    pod = job["spec"]["tasks"][0]["template"]
    assert pod["metadata"]["labels"]["ring-controller.atlas"] == "ascend-910b"
    mounts = {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert {"/usr/local/Ascend/driver", "/dev/shm", "/mnt/shared"} <= mounts
    assert "huawei.com/npu" not in files["volcano-job.yaml"].decode()
    # CANN is sourced by the image's launcher, from launch.json (checked with the other run files), not by run.sh
    assert "/usr/local/Ascend/ascend-toolkit/set_env.sh" in json.loads(files["launch.json"])["cann_env"]
    assert "set_env.sh" not in files["run.sh"].decode()
    assert json.loads(files["launch.json"])["env"]["HCCL_CONNECT_TIMEOUT"] == "1800"
    assert "ARG BASE_IMAGE=quay.io/ascend/cann:9.1.0-910b-ubuntu22.04-py3.12" in files["Dockerfile"].decode()
    assert "torch_npu==2.12.0" in files["Dockerfile"].decode()


def test_cuda_bundle_has_no_ascend_parts() -> None:
    files = render_files(["recipe=llama3_8b_lora", "hw=h100"])
    assert "Ascend" not in files["run.sh"].decode() and "torch_npu" not in files["Dockerfile"].decode()
    assert json.loads(files["launch.json"])["cann_env"] == []
    assert "nvidia.com/gpu: '8'" in files["volcano-job.yaml"].decode()
    assert "peft==" in files["Dockerfile"].decode()


@pytest.mark.parametrize(
    "overrides",
    [
        ["recipe=qwen2.5_14b_sft"],
        ["recipe=llama3_8b_lora", "hw=h100"],
        ["recipe=tiny_sft"],
        ["recipe=llama3_8b_sft", "cluster.socket_ifname=eth0"],
    ],
)
def test_run_sh_passes_shellcheck(tmp_path: Path, overrides: list[str]) -> None:
    (tmp_path / "run.sh").write_bytes(render_files(overrides)["run.sh"])
    result = subprocess.run([_tool("shellcheck"), str(tmp_path / "run.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize(
    "overrides", [["recipe=qwen2.5_14b_sft"], ["recipe=llama3_8b_lora", "hw=h100"], ["recipe=tiny_sft"]]
)
def test_dockerfile_passes_hadolint(tmp_path: Path, overrides: list[str]) -> None:
    (tmp_path / "Dockerfile").write_bytes(render_files(overrides)["Dockerfile"])
    result = subprocess.run([_tool("hadolint"), str(tmp_path / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_existing_non_bundle_directory_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(RecipeError, match="not a recipekit bundle"):
        build(["recipe=tiny_sft"], target)
    assert (target / "notes.txt").read_text() == "keep me"
    build(["recipe=tiny_sft"], target, force=True)
    assert is_bundle(target) and not (target / "notes.txt").exists()


def test_rebuilding_over_a_bundle_replaces_it_whole(tmp_path: Path) -> None:
    build(["recipe=tiny_sft"], tmp_path / "b")
    (tmp_path / "b" / "stale.txt").write_text("old")
    build(["recipe=tiny_sft", "parallel=ddp"], tmp_path / "b", force=True)  # another recipe: --force
    assert not (tmp_path / "b" / "stale.txt").exists() and not (tmp_path / "b" / "ds_config.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["b"], "no staging directories left behind"


def test_failed_build_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(RecipeError):
        build(["recipe=tiny_sft", "train.micro_batch_size=0"], tmp_path / "b")
    assert list(tmp_path.iterdir()) == []


def test_build_refuses_a_recipe_that_will_not_fit(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as info:
        build(["model=llama3_70b", "parallel=ddp"], tmp_path / "b")
    problem = info.value.problems[0]
    assert problem.key == "memory" and "largest item" in problem.message and "cheapest change" in problem.hint
    assert not (tmp_path / "b").exists()
    built = build(["model=llama3_70b", "parallel=ddp"], tmp_path / "b", allow_oom=True)
    assert not built.estimate.fits and (tmp_path / "b" / "plan.md").exists()


def test_ascend_scheduling_details_follow_mindcluster() -> None:
    """Typed host paths, NPUs from the device plugin's annotation, labels on Job and pods, no mesh sidecar."""
    job = yaml.safe_load(render_files(["recipe=llama3_8b_sft", "hw=ascend910b"])["volcano-job.yaml"])
    template = job["spec"]["tasks"][0]["template"]
    container = template["spec"]["containers"][0]
    host_paths = {v["hostPath"]["path"]: v["hostPath"]["type"] for v in template["spec"]["volumes"] if "hostPath" in v}
    assert host_paths == {
        "/usr/local/Ascend/driver": "Directory",
        "/usr/local/dcmi": "Directory",
        "/usr/local/bin/npu-smi": "File",
        "/etc/ascend_install.info": "File",
    }
    assert container["env"][:-1] == [
        {
            "name": "ASCEND_VISIBLE_DEVICES",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['huawei.com/Ascend910']"}},
        }
    ]
    assert container["env"][-1]["name"] == "RECIPEKIT_RUN_FILES_DIGEST"  # the run files' digest (bundle/runfiles.py)
    assert job["metadata"]["labels"]["ring-controller.atlas"] == template["metadata"]["labels"]["ring-controller.atlas"]
    assert template["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert "sp-block" not in template["metadata"]["annotations"]
    assert template["spec"]["nodeSelector"] == {
        "accelerator-type": "module-910b-8",
        "kubernetes.io/arch": "arm64",
        "host-arch": "huawei-arm",
    }
    x86 = yaml.safe_load(render_files(["recipe=llama3_8b_sft", "hw.arch=amd64"])["volcano-job.yaml"])
    assert x86["spec"]["tasks"][0]["template"]["spec"]["nodeSelector"]["host-arch"] == "huawei-x86"


def test_a3_box8_and_superpod_select_their_own_nodes() -> None:
    box8 = yaml.safe_load(render_files(["recipe=llama3_8b_sft", "hw=ascend910_a3"])["volcano-job.yaml"])
    assert box8["spec"]["tasks"][0]["template"]["spec"]["nodeSelector"]["accelerator-type"] == "module-a3-16"
    superpod = yaml.safe_load(
        render_files(["recipe=llama3_8b_sft", "hw=ascend910_a3_superpod", "cluster.nodes=4"])["volcano-job.yaml"]
    )
    template = superpod["spec"]["tasks"][0]["template"]
    assert template["spec"]["nodeSelector"]["accelerator-type"] == "module-a3-16-super-pod"
    # 4 nodes × 16 dies fit one SuperPoD: one logical block of the whole job, on the Job and its pods
    assert superpod["metadata"]["annotations"]["sp-block"] == template["metadata"]["annotations"]["sp-block"] == "64"


def test_superpod_block_splits_jobs_larger_than_a_superpod() -> None:
    from recipekit.bundle.build import resolve

    plan = resolve(
        ["recipe=llama3_70b_sft", "hw=ascend910_a3_superpod", "cluster.nodes=48", "train.global_batch_size=1536"]
    ).plan
    assert plan.layout.world_size == 768 and plan.superpod_block == 384


def test_pod_requests_follow_node_allocatable_and_refuse_what_never_schedules() -> None:
    from recipekit.base.errors import RecipeError
    from recipekit.bundle.build import resolve

    plan = resolve(["recipe=llama3_8b_sft", "hw=ascend910b", "cluster.devices_per_pod=4"]).plan
    assert (plan.pod_cpus, plan.pod_memory_gib) == (86, 435)  # half a node: 192 × ½ × 0.9, 1024 × ½ × 0.85
    try:
        resolve(["recipe=llama3_8b_sft", "cluster.memory_gib_per_pod=2000"])
    except RecipeError as err:
        assert "2000 GiB per pod, but a ascend910b node offers 1024 GiB" in str(err)
    else:
        raise AssertionError("a request above the node's memory was accepted")


AWKWARD_VALUES = {
    "unicode": "训练 — naïve café ✓",
    "beyond the basic plane": "launch 🚀",
    "next line (NEL)": "a\x85b",
    "other separators and controls": "a\u2028b\ufeff\x07\x7f\xa0\r",
    "multi-line": "line one\nline two\n\n  indented\n",
    "multi-line without a final newline": "a\nb",
    "trailing spaces": "value   ",
    "leading space": "  value",
    "looks like a number": "1e-05",
    "looks like a bool": "yes",
    "null-like": "~",
    "special start": "- item: [x] {y} & *z ! | > % @ `",
    "colon space": "key: value # not a comment",
    "long without spaces": "x" * 300,
    "long with spaces": " ".join(["word"] * 80),
    "quotes": 'it\'s "quoted"',
    "tab": "a\tb",
    "empty": "",
    "numbers": [0, -1, 2**40, 1e-05, 0.1, 3.0, float("inf")],
    "booleans and none": [True, False, None],
    "empty containers": {"list": [], "dict": {}},
    "nested": {"a": [{"b": {"c": ["d", {"e": "f\ng"}]}}]},
    "key: with colon": 1,
    "7": "numeric-looking key",
    "a key with 🚀 and \x85": "value",
}


@pytest.mark.skipif(not hasattr(yaml, "CSafeDumper"), reason="PyYAML without libyaml: only one emitter here")
@pytest.mark.parametrize("name", sorted(AWKWARD_VALUES))
def test_libyaml_and_python_emitters_write_the_same_bytes(name: str) -> None:
    """Bundles are byte-identical whether or not the building machine's PyYAML has libyaml."""
    from recipekit.bundle import render

    data = {"value": AWKWARD_VALUES[name], name: "as a key"}
    chosen, python = render._yaml(data, "h"), render._yaml(data, "h", render.PYTHON_DUMPER)
    assert render.DUMPER is not render.PYTHON_DUMPER
    assert chosen == python
    assert yaml.safe_load(chosen) == data


def test_kubectl_apply_k_of_the_bundle_applies_the_configmap_then_the_job() -> None:
    files = render_files(["recipe=llama3_8b_sft"])
    kustomization = yaml.safe_load(files["kustomization.yaml"])
    assert kustomization["kind"] == "Kustomization"
    kinds = [yaml.safe_load(files[name])["kind"] for name in kustomization["resources"]]
    assert kinds == ["ConfigMap", "Job"]  # the run files exist before a pod mounts them
    # what kubectl -f of the directory would trip on is left out: every listed file is a Kubernetes object
    assert not [name for name in kustomization["resources"] if not name.endswith(".yaml")]


def test_the_hot_tier_is_a_node_local_volume_of_the_job_only_when_asked_for() -> None:
    """train.hot_checkpoints: a hostPath (kept on the node across pod restarts) or an emptyDir (deleted with the pod)
    mounted where the runtime saves checkpoints first; without it the Job has no such volume."""

    def hot_volume(overrides: list[str]) -> tuple[list[dict], list[dict]]:
        job = yaml.safe_load(render_files(["recipe=tiny_sft", *overrides])["volcano-job.yaml"])
        spec = job["spec"]["tasks"][0]["template"]["spec"]
        volumes = [v for v in spec["volumes"] if v["name"] == "hot-checkpoints"]
        return volumes, [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "hot-checkpoints"]

    assert hot_volume([]) == ([], [])
    volumes, mounts = hot_volume(["train.hot_checkpoints.medium=hostPath", "train.hot_checkpoints.host_path=/nvme/ck"])
    assert volumes == [{"name": "hot-checkpoints", "hostPath": {"path": "/nvme/ck", "type": "DirectoryOrCreate"}}]
    assert mounts == [{"name": "hot-checkpoints", "mountPath": "/var/lib/recipekit/hot"}]
    volumes, _ = hot_volume(["train.hot_checkpoints.medium=emptyDir", "train.hot_checkpoints.size_gib=200"])
    assert volumes == [{"name": "hot-checkpoints", "emptyDir": {"sizeLimit": "200Gi"}}]


def test_the_hot_tier_keeps_one_or_two_checkpoints() -> None:
    with pytest.raises(RecipeError, match="keep"):
        render_files(["recipe=tiny_sft", "train.hot_checkpoints.medium=hostPath", "train.hot_checkpoints.keep=3"])


def test_a_hot_tier_mounted_on_the_shared_volume_is_refused() -> None:
    with pytest.raises(RecipeError, match="train.hot_checkpoints.mount_path"):
        render_files(
            [
                "recipe=tiny_sft",
                "train.hot_checkpoints.medium=emptyDir",
                "train.hot_checkpoints.mount_path=/mnt/shared/hot",
            ]
        )
