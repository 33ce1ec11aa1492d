"""`recipekit validate` static checks: good bundles pass, and each rule catches the one breakage it exists for.

Bundles are built with ``recipekit.bundle.build.build`` into a temporary directory once per module; each breakage copies
one, changes it in exactly one way (then re-hashes manifest.json, so only the rule under test can object, except
for the hash rule itself) and asserts that the expected check fails with a message naming the file and field.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from recipekit.bundle.build import build
from recipekit.cli.validate import validate_command
from recipekit.runtime.boundary import exitcodes
from recipekit.validate import validate
from recipekit.validate.shared.loader import BundleUnusable, load_bundle, rehash_manifest
from recipekit.validate.shared.results import Result, Status, Verdict
from recipekit.validate.static.checks import run_static
from recipekit.validate.static.volcano import policy_findings, schema_findings, webhook_findings

#: The Job's first event policy comes after the runtime contract's exitCode policies.
E = len(exitcodes.exit_code_policies())

BUNDLES = {
    "tiny": ["recipe=tiny_sft"],
    "llama": ["recipe=llama3_8b_sft", "hw=ascend910b"],
    "qwen": ["recipe=qwen2.5_14b_sft"],
    "lora_a100": ["recipe=llama3_8b_lora", "hw=a100_80g"],
    "elastic": ["recipe=tiny_sft", "parallel=ddp", "cluster.nodes=2", "cluster.min_nodes=1"],
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bundles")
    return {name: build(overrides, root / name, force=True).path for name, overrides in BUNDLES.items()}


def needs(*modules: str) -> None:
    """Skip unless installed, without importing them here (the checks run them in a child process)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _statuses(results: list) -> dict[str, Status]:
    return {r.id: r.status for r in results}


# ------------------------------------------------------------------------------------------------- good bundles
@pytest.mark.parametrize("name", sorted(BUNDLES))
def test_good_bundle_passes_every_static_check(built: dict[str, Path], name: str) -> None:
    results = run_static(load_bundle(built[name]), libraries=False)
    failed = [f"{r.id}: {[str(f) for f in r.findings]}" for r in results if r.failed]
    assert not failed, failed
    assert {r.id for r in results} >= {
        "files.parse",
        "files.manifest",
        "volcano.schema",
        "volcano.webhook",
        "volcano.pod-template",
        "consistency.world-size",
        "consistency.task-env",
        "consistency.device",
        "consistency.batch",
        "consistency.precision",
        "consistency.image",
        "image.context",
        "consistency.storage",
        "lint.shellcheck",
        "lint.hadolint",
    }
    # The linters and kubernetes-validate come with the test extra: here they really ran.
    statuses = _statuses(results)
    assert statuses["lint.shellcheck"] is Status.PASS and statuses["lint.hadolint"] is Status.PASS
    assert statuses["volcano.pod-template"] is Status.PASS


@pytest.mark.parametrize("name", ["llama", "tiny"])
def test_good_bundle_passes_the_transformers_and_deepspeed_cross_checks(built: dict[str, Path], name: str) -> None:
    needs("transformers", "deepspeed")
    results = run_static(load_bundle(built[name]), libraries=True)
    statuses = _statuses(results)
    assert statuses["library.transformers"] is Status.PASS, [str(f) for r in results for f in r.findings]
    assert statuses["library.deepspeed"] is Status.PASS


def test_static_validation_imports_no_training_library(built: dict[str, Path]) -> None:
    code = (
        "import sys; from recipekit.validate import validate; "
        f"report = validate({str(built['llama'])!r}); "
        "heavy = [m for m in ('torch', 'transformers', 'deepspeed') if m in sys.modules]; "
        "print(report.ok, heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "True []", out.stdout + out.stderr


# --------------------------------------------------------------------------------------------------- breakages
def edit_yaml(name: str, change: Callable[[Any], Any]) -> Callable[[Path], None]:
    def apply(bundle: Path) -> None:
        path = bundle / name
        data = yaml.safe_load(path.read_text())
        change(data)  # mutates in place
        path.write_text(yaml.safe_dump(data, sort_keys=False))

    return apply


def edit_json(name: str, change: Callable[[Any], Any]) -> Callable[[Path], None]:
    def apply(bundle: Path) -> None:
        path = bundle / name
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data, indent=2))

    return apply


def edit_text(name: str, old: str, new: str) -> Callable[[Path], None]:
    def apply(bundle: Path) -> None:
        path = bundle / name
        text = path.read_text()
        assert old in text, f"{old!r} not in {name}"
        path.write_text(text.replace(old, new, 1))

    return apply


def write(name: str, text: str) -> Callable[[Path], None]:
    return lambda bundle: (bundle / name).write_text(text)


def task(job: dict) -> dict:
    return job["spec"]["tasks"][0]


def container(job: dict) -> dict:
    return task(job)["template"]["spec"]["containers"][0]


def _set(mapping: dict, key: str, value: Any) -> None:
    mapping[key] = value


# (id, bundle, mutation, check that must fail, substrings its findings must contain, rehash manifest)
Breakage = tuple[str, str, Callable[[Path], None], str, tuple[str, ...], bool]
BREAKAGES: list[Breakage] = [
    # every file parses
    (
        "recipe-yaml-syntax",
        "tiny",
        write("recipe.yaml", "recipe: [unclosed\n"),
        "files.parse",
        ("recipe.yaml", "not valid YAML"),
        True,
    ),
    (
        "ds-config-json-syntax",
        "tiny",
        write("ds_config.json", '{"train_batch_size": 4,'),
        "files.parse",
        ("ds_config.json", "not valid JSON"),
        True,
    ),
    (
        "job-yaml-syntax",
        "tiny",
        write("volcano-job.yaml", "spec: {tasks: [\n"),
        "files.parse",
        ("volcano-job.yaml", "not valid YAML"),
        True,
    ),
    (
        "recipe-unknown-key",
        "tiny",
        edit_yaml("recipe.yaml", lambda d: _set(d["recipe"]["train"], "micro_bach_size", 2)),
        "files.parse",
        ("recipe.yaml recipe.train.micro_bach_size", "unknown key"),
        True,
    ),
    (
        "recipe-bad-value",
        "tiny",
        edit_yaml("recipe.yaml", lambda d: _set(d["recipe"]["cluster"], "nodes", 0)),
        "files.parse",
        ("recipe.yaml recipe.cluster.nodes",),
        True,
    ),
    (
        "plan-missing-key",
        "tiny",
        edit_yaml("recipe.yaml", lambda d: d["plan"].pop("world_size")),
        "files.parse",
        ("recipe.yaml plan.world_size", "missing"),
        True,
    ),
    ("plan-json-syntax", "tiny", write("plan.json", "{"), "files.parse", ("plan.json", "not valid JSON"), True),
    (
        "run-sh-syntax",
        "tiny",
        edit_text("run.sh", "exec python3", "exec python3 ("),
        "files.parse",
        ("run.sh", "bash -n"),
        True,
    ),
    (
        "launch-json-type",
        "tiny",
        edit_json("launch.json", lambda d: _set(d, "nodes", "2")),
        "files.parse",
        ("launch.json nodes", "must be int"),
        True,
    ),
    (
        "train-py-syntax",
        "tiny",
        edit_text("runtime/train.py", "def main(", "def main(("),
        "files.parse",
        ("runtime/train.py", "syntax error"),
        True,
    ),
    # manifest hashes, missing and extra files
    (
        "hand-edited-file",
        "tiny",
        edit_text("run.sh", "set -euo pipefail", "set -eo pipefail"),
        "files.manifest",
        ("run.sh", "edited after the build"),
        False,
    ),
    ("missing-file", "tiny", lambda b: (b / "README.md").unlink(), "files.manifest", ("README.md", "missing"), False),
    ("extra-file", "tiny", write("notes.txt", "mine\n"), "files.manifest", ("notes.txt", "extra file"), False),
    # Volcano Job schema
    (
        "job-unknown-field",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(j["spec"], "minAvailble", 2)),
        "volcano.schema",
        ("volcano-job.yaml spec.minAvailble", "unknown field", "minAvailable"),
        True,
    ),
    (
        "job-unknown-task-field",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(task(j), "replica", 2)),
        "volcano.schema",
        ("volcano-job.yaml spec.tasks[0].replica", "unknown field"),
        True,
    ),
    (
        "job-wrong-type",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(task(j), "replicas", "2")),
        "volcano.schema",
        ("volcano-job.yaml spec.tasks[0].replicas", "32-bit integer"),
        True,
    ),
    (
        "job-plugin-args-not-list",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(j["spec"]["plugins"], "env", "on")),
        "volcano.schema",
        ("volcano-job.yaml spec.plugins.env", "must be a list"),
        True,
    ),
    (
        "job-policy-timeout-not-duration",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(j["spec"]["policies"][E], "timeout", 30)),
        "volcano.schema",
        (f"volcano-job.yaml spec.policies[{E}].timeout", "duration"),
        True,
    ),
    (
        "job-newer-field",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(j["spec"], "networkTopology", {"mode": "hard"})),
        "volcano.schema",
        ("volcano-job.yaml spec.networkTopology", "older clusters"),
        True,
    ),
    # Volcano admission webhook
    (
        "task-min-available-over-replicas",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(task(j), "minAvailable", 3)),
        "volcano.webhook",
        ("volcano-job.yaml spec.tasks[0].minAvailable", "greater than the task's replicas (2)"),
        True,
    ),
    (
        "job-min-available-over-replicas",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(j["spec"], "minAvailable", 5)),
        "volcano.webhook",
        ("volcano-job.yaml spec.minAvailable", "total replicas"),
        True,
    ),
    (
        "duplicate-task-names",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: j["spec"]["tasks"].append(task(j))),
        "volcano.webhook",
        ("volcano-job.yaml spec.tasks[1].name", "duplicated task name"),
        True,
    ),
    (
        "no-tasks",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(j["spec"], "tasks", [])),
        "volcano.webhook",
        ("volcano-job.yaml spec.tasks", "no task"),
        True,
    ),
    (
        "policy-event-and-exit-code",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(j["spec"]["policies"][E], "exitCode", 3)),
        "volcano.webhook",
        (f"volcano-job.yaml spec.policies[{E}]", "event and exitCode together"),
        True,
    ),
    (
        "policy-neither",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: j["spec"]["policies"].append({"action": "RestartJob"})),
        "volcano.webhook",
        (f"volcano-job.yaml spec.policies[{E + 3}]", "neither event nor exitCode"),
        True,
    ),
    (
        "policy-exit-code-zero",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: j["spec"]["policies"].append({"exitCode": 0, "action": "RestartJob"})),
        "volcano.webhook",
        (f"volcano-job.yaml spec.policies[{E + 3}].exitCode", "0 is not a valid"),
        True,
    ),
    (
        "policy-duplicate-event",
        "tiny",
        edit_yaml(
            "volcano-job.yaml", lambda j: j["spec"]["policies"].append({"event": "PodFailed", "action": "AbortJob"})
        ),
        "volcano.webhook",
        (f"volcano-job.yaml spec.policies[{E + 3}].event", "duplicate event 'PodFailed'"),
        True,
    ),
    (
        "policy-star-with-others",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: j["spec"]["policies"].append({"event": "*", "action": "AbortJob"})),
        "volcano.webhook",
        ("volcano-job.yaml spec.policies", "'*' must be the only event"),
        True,
    ),
    (
        "policy-bad-action",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(j["spec"]["policies"][E], "action", "Reboot")),
        "volcano.webhook",
        (f"volcano-job.yaml spec.policies[{E}].action", "invalid policy action 'Reboot'"),
        True,
    ),
    (
        "policy-bad-event",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(j["spec"]["policies"][E], "event", "PodCrashed")),
        "volcano.webhook",
        (f"volcano-job.yaml spec.policies[{E}].event", "invalid policy event 'PodCrashed'"),
        True,
    ),
    (
        "unknown-plugin",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(j["spec"]["plugins"], "torchrun", [])),
        "volcano.webhook",
        ("volcano-job.yaml spec.plugins.torchrun", "unknown job plugin"),
        True,
    ),
    (
        "pod-name-too-long",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(task(j), "name", "w" * 60)),
        "volcano.webhook",
        ("volcano-job.yaml spec.tasks[0].name", "63 characters"),
        True,
    ),
    (
        "task-name-not-dns",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(task(j), "name", "Worker_1")),
        "volcano.webhook",
        ("volcano-job.yaml spec.tasks[0].name", "DNS-1123"),
        True,
    ),
    (
        "volume-without-mount-path",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(j["spec"], "volumes", [{"volumeClaimName": "scratch"}])),
        "volcano.webhook",
        ("volcano-job.yaml spec.volumes[0].mountPath", "required"),
        True,
    ),
    # the pod template as Kubernetes validates it
    (
        "pod-unknown-container-field",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(container(j), "imagePullPolicyy", "x")),
        "volcano.pod-template",
        ("volcano-job.yaml spec.tasks[0].template.spec.containers[0]", "imagePullPolicyy"),
        True,
    ),
    (
        "pod-bad-restart-policy",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(task(j)["template"]["spec"], "restartPolicy", "Sometimes")),
        "volcano.pod-template",
        ("volcano-job.yaml spec.tasks[0].template.spec.restartPolicy",),
        True,
    ),
    (
        "pod-mount-of-undeclared-volume",
        "tiny",
        edit_yaml(
            "volcano-job.yaml", lambda j: container(j)["volumeMounts"].append({"name": "ghost", "mountPath": "/g"})
        ),
        "volcano.pod-template",
        ("volcano-job.yaml spec.tasks[0].template.spec.containers[0].volumeMounts[4].name", "ghost"),
        True,
    ),
    (
        "pod-extended-resource-overcommit",
        "llama",
        edit_yaml(
            "volcano-job.yaml", lambda j: _set(container(j)["resources"]["requests"], "huawei.com/Ascend910", "4")
        ),
        "volcano.pod-template",
        ("volcano-job.yaml spec.tasks[0].template.spec.containers[0].resources", "must equal limit"),
        True,
    ),
    # cross-file consistency
    (
        "replicas-vs-world-size",
        "llama",
        edit_yaml("volcano-job.yaml", lambda j: _set(task(j), "replicas", 2)),
        "consistency.world-size",
        ("volcano-job.yaml spec.tasks[0].replicas", "2 × 8 = 16", "plan.world_size = 8"),
        True,
    ),
    (
        "device-count-vs-world-size",
        "llama",
        edit_yaml(
            "volcano-job.yaml",
            lambda j: [_set(container(j)["resources"][k], "huawei.com/Ascend910", "4") for k in ("requests", "limits")],
        ),
        "consistency.world-size",
        ("volcano-job.yaml spec.tasks[0].replicas", "1 × 4 = 4"),
        True,
    ),
    (
        "run-sh-expected-nodes",
        "qwen",
        edit_json("launch.json", lambda d: _set(d, "nodes", 3)),
        "consistency.world-size",
        ("launch.json nodes", "3, but volcano-job.yaml spec.tasks[0].replicas = 2"),
        True,
    ),
    (
        "run-sh-nproc",
        "llama",
        edit_json("launch.json", lambda d: _set(d, "nproc_per_node", 4)),
        "consistency.world-size",
        ("launch.json nproc_per_node", "4 processes per pod"),
        True,
    ),
    (
        "job-not-gang",
        "qwen",
        edit_yaml("volcano-job.yaml", lambda j: _set(j["spec"], "minAvailable", 1)),
        "consistency.world-size",
        ("volcano-job.yaml spec.minAvailable", "static rendezvous"),
        True,
    ),
    (
        "elastic-gang-without-the-rendezvous-pod",
        "elastic",
        edit_yaml("volcano-job.yaml", lambda j: _set(j["spec"], "minAvailable", 1)),
        "consistency.world-size",
        ("volcano-job.yaml spec.minAvailable", "the gang is 1 + the rendezvous pod"),
        True,
    ),
    (
        "elastic-rendezvous-task-removed",
        "elastic",
        edit_yaml("volcano-job.yaml", lambda j: j["spec"]["tasks"].pop()),
        "consistency.world-size",
        ("volcano-job.yaml spec.tasks", "no task 'rdzv', the rendezvous pod launch.json elastic.rendezvous names"),
        True,
    ),
    (
        "elastic-rendezvous-pod-trains",
        "elastic",
        edit_yaml("volcano-job.yaml", lambda j: j["spec"]["tasks"][1]["template"]["spec"]["containers"][0].pop("args")),
        "consistency.world-size",
        ("spec.tasks[1].template.spec.containers[0].args", "serves the store only with ['--serve-rendezvous']"),
        True,
    ),
    (
        "task-renamed",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(task(j), "name", "trainer")),
        "consistency.task-env",
        ("launch.json task_env", "named 'trainer'", "VC_TRAINER_HOSTS"),
        True,
    ),
    (
        "svc-plugin-missing",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: j["spec"]["plugins"].pop("svc")),
        "consistency.task-env",
        ("volcano-job.yaml spec.plugins.svc", "only the svc plugin sets"),
        True,
    ),
    (
        "env-plugin-missing",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: j["spec"]["plugins"].pop("env")),
        "consistency.task-env",
        ("volcano-job.yaml spec.plugins.env", "VC_TASK_INDEX"),
        True,
    ),
    (
        "wrong-device-resource",
        "llama",
        edit_yaml(
            "volcano-job.yaml",
            lambda j: [
                container(j)["resources"][k].update(
                    {"huawei.com/npu": container(j)["resources"][k].pop("huawei.com/Ascend910")}
                )
                for k in ("requests", "limits")
            ],
        ),
        "consistency.device",
        ("volcano-job.yaml spec.tasks[0].template.spec.containers[0].resources", "huawei.com/Ascend910"),
        True,
    ),
    (
        "recipe-device-resource-for-chip",
        "llama",
        edit_yaml("recipe.yaml", lambda d: _set(d["recipe"]["hw"], "device_resource", "huawei.com/npu")),
        "consistency.device",
        ("recipe.yaml recipe.hw.device_resource", "huawei.com/Ascend910"),
        True,
    ),
    (
        "missing-ring-controller-label",
        "llama",
        edit_yaml("volcano-job.yaml", lambda j: task(j)["template"]["metadata"]["labels"].pop("ring-controller.atlas")),
        "consistency.device",
        ("volcano-job.yaml spec.tasks[0].template.metadata.labels.ring-controller.atlas",),
        True,
    ),
    (
        "ds-accelerator",
        "llama",
        edit_json("launch.json", lambda d: _set(d["env"], "DS_ACCELERATOR", "cuda")),
        "consistency.device",
        ("launch.json env.DS_ACCELERATOR", "'cuda'", "'npu'"),
        True,
    ),
    (
        "ddp-backend",
        "llama",
        edit_yaml("recipe.yaml", lambda d: _set(d["training_arguments"], "ddp_backend", "nccl")),
        "consistency.device",
        ("recipe.yaml training_arguments.ddp_backend", "hccl"),
        True,
    ),
    (
        "ds-train-batch-size",
        "llama",
        edit_json("ds_config.json", lambda d: _set(d, "train_batch_size", 64)),
        "consistency.batch",
        ("ds_config.json train_batch_size", "64 != micro (2) × accumulation (8) × world (8) = 128"),
        True,
    ),
    (
        "ds-accumulation",
        "llama",
        edit_json("ds_config.json", lambda d: _set(d, "gradient_accumulation_steps", 4)),
        "consistency.batch",
        ("ds_config.json gradient_accumulation_steps", "4, but recipe.yaml"),
        True,
    ),
    (
        "ds-micro-batch",
        "qwen",
        edit_json("ds_config.json", lambda d: _set(d, "train_micro_batch_size_per_gpu", 2)),
        "consistency.batch",
        ("ds_config.json train_micro_batch_size_per_gpu",),
        True,
    ),
    (
        "ds-precision",
        "llama",
        edit_json("ds_config.json", lambda d: _set(d, "bf16", {"enabled": False})),
        "consistency.batch",
        ("ds_config.json bf16.enabled", "plan.precision = bf16"),
        True,
    ),
    (
        "ds-zero-stage",
        "llama",
        edit_json("ds_config.json", lambda d: _set(d["zero_optimization"], "stage", 2)),
        "consistency.batch",
        ("ds_config.json zero_optimization.stage", "plan.zero_stage = 3"),
        True,
    ),
    (
        "zero3-no-16bit-gather",
        "llama",
        edit_json(
            "ds_config.json", lambda d: _set(d["zero_optimization"], "stage3_gather_16bit_weights_on_model_save", False)
        ),
        "consistency.batch",
        ("ds_config.json zero_optimization.stage3_gather_16bit_weights_on_model_save", "placeholders"),
        True,
    ),
    (
        "trainer-fp16-vs-plan",
        "llama",
        edit_yaml("recipe.yaml", lambda d: _set(d["training_arguments"], "fp16", True)),
        "consistency.batch",
        ("recipe.yaml training_arguments.bf16", "plan.precision = bf16"),
        True,
    ),
    (
        "bf16-on-hardware-without-it",
        "llama",
        edit_yaml("recipe.yaml", lambda d: _set(d["recipe"]["hw"], "supports_bf16", False)),
        "consistency.precision",
        ("recipe.yaml plan.precision", "has no bf16"),
        True,
    ),
    (
        "torch-npu-pin-vs-torch",
        "llama",
        edit_text("Dockerfile", "torch_npu==2.12.0", "torch_npu==2.11.0"),
        "consistency.image",
        ("Dockerfile", "torch_npu 2.11.0 needs torch 2.11.0"),
        True,
    ),
    (
        "torch-npu-pin-dropped",
        "llama",
        edit_text("Dockerfile", "torch_npu==2.12.0", "torch-npu-free"),
        "consistency.image",
        ("Dockerfile RUN pip install torch_npu", "pins torch_npu 2.12.0"),
        True,
    ),
    (
        "cann-base-vs-torch-npu",
        "llama",
        edit_text(
            "Dockerfile", "BASE_IMAGE=quay.io/ascend/cann:9.1.0-910b", "BASE_IMAGE=quay.io/ascend/cann:9.0.0-910b"
        ),
        "consistency.image",
        ("Dockerfile", "needs CANN 9.1.0"),
        True,
    ),
    (
        "base-image-wrong-chip",
        "llama",
        edit_text("Dockerfile", "9.1.0-910b-ubuntu", "9.1.0-a3-ubuntu"),
        "consistency.image",
        ("Dockerfile FROM", "not for chip 910b"),
        True,
    ),
    (
        "torch-unpinned",
        "tiny",
        edit_text("Dockerfile", 'torch="torch==2.13.0+cpu"', 'torch="torch"'),
        "consistency.image",
        ("Dockerfile RUN pip install torch", "not pinned"),
        True,
    ),
    (
        "output-dir-off-the-pvc",
        "tiny",
        edit_yaml(
            "recipe.yaml",
            lambda d: [
                _set(d["training_arguments"], "output_dir", "/tmp/out"),
                _set(d["plan"], "output_dir", "/tmp/out"),
            ],
        ),
        "consistency.storage",
        ("recipe.yaml training_arguments.output_dir", "/tmp/out is not under the PVC mount"),
        True,
    ),
    (
        "no-pvc",
        "tiny",
        edit_yaml(
            "volcano-job.yaml",
            lambda j: [task(j)["template"]["spec"]["volumes"].pop(1), container(j)["volumeMounts"].pop(1)],
        ),
        "consistency.storage",
        ("volcano-job.yaml spec.tasks[0].template.spec.volumes", "PersistentVolumeClaim"),
        True,
    ),
    (
        "master-port",
        "tiny",
        edit_json("launch.json", lambda d: _set(d, "master_port", 29501)),
        "consistency.port",
        ("launch.json master_port", "29501, but recipe.yaml plan.master_port = 29500"),
        True,
    ),
    (
        "shellcheck",
        "tiny",
        edit_text("run.sh", "exec python3", "echo $BUNDLE_DIR\nexec python3"),
        "lint.shellcheck",
        ("run.sh line", "SC2086"),
        True,
    ),
    (
        "hadolint",
        "tiny",
        edit_text("Dockerfile", "WORKDIR", "RUN apt-get update && apt-get install -y curl\nWORKDIR"),
        "lint.hadolint",
        ("Dockerfile line", "DL3008"),
        True,
    ),
]


def _edit_run_file(data: dict, name: str, old: str, new: str) -> None:
    assert old in data["data"][name]
    data["data"][name] = data["data"][name].replace(old, new, 1)


# the run files beside the image: the ConfigMap, its mount and the digest the Job carries
BREAKAGES += [
    (
        "configmap-recipe-edited",
        "tiny",
        edit_yaml("run-files.yaml", lambda d: _edit_run_file(d, "recipe.yaml", "learning_rate:", "learning_rate: 1 #")),
        "runfiles.configmap",
        ("run-files.yaml data.recipe.yaml", "differs from the bundle's recipe.yaml"),
        True,
    ),
    (
        "configmap-schema",
        "tiny",
        edit_yaml("run-files.yaml", lambda d: _set(d, "spec", {"replicas": 1})),
        "runfiles.configmap",
        ("run-files.yaml", "spec"),
        True,
    ),
    (
        "configmap-namespace",
        "tiny",
        edit_yaml("run-files.yaml", lambda d: _set(d["metadata"], "namespace", "elsewhere")),
        "runfiles.configmap",
        ("run-files.yaml metadata.namespace", "not the Job's namespace"),
        True,
    ),
    (
        "job-run-files-digest",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(container(j)["env"][-1], "value", "sha256:" + "0" * 64)),
        "runfiles.configmap",
        ("volcano-job.yaml spec.tasks[0].template.spec.containers[0].env", "RECIPEKIT_RUN_FILES_DIGEST must be"),
        True,
    ),
    (
        "run-files-mount-writable",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(container(j)["volumeMounts"][-1], "readOnly", False)),
        "runfiles.configmap",
        ("volumeMounts", "mounted readOnly: true"),
        True,
    ),
    (  # issue 38: a Dockerfile or runtime edited after the build, manifest.json re-hashed to hide it
        "dockerfile-edited-rehashed",
        "tiny",
        edit_text("Dockerfile", "WORKDIR /workspace", "RUN echo planted\nWORKDIR /workspace"),
        "image.context",
        ("Dockerfile, runtime/", "hash to stack", "plan.image is"),
        True,
    ),
    (
        "runtime-edited-rehashed",
        "tiny",
        edit_text(
            "runtime/train.py", "from __future__ import annotations\n", "from __future__ import annotations\n#\n"
        ),
        "image.context",
        ("Dockerfile, runtime/", "hash to stack"),
        True,
    ),
    (
        "job-command-runs-run-sh",  # issue 38: a file of the ConfigMap would run before the launcher checks it
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: _set(container(j), "command", ["bash", "/workspace/run/run.sh"])),
        "runfiles.configmap",
        ("containers[0].command", "the image's launcher, which checks the run files before any of them"),
        True,
    ),
    (
        "run-files-not-mounted",
        "tiny",
        edit_yaml("volcano-job.yaml", lambda j: container(j)["volumeMounts"].pop()),
        "runfiles.configmap",
        ("volumeMounts", "no mount of ConfigMap 'tiny-sft-"),
        True,
    ),
]


@pytest.mark.parametrize("case", BREAKAGES, ids=[b[0] for b in BREAKAGES])
def test_each_rule_catches_its_breakage(built: dict[str, Path], tmp_path: Path, case: Breakage) -> None:
    _, source, mutate, check_id, expected, rehash = case
    bundle = _copy(built[source], tmp_path / source)
    mutate(bundle)
    if rehash:
        rehash_manifest(bundle)
    results = {r.id: r for r in run_static(load_bundle(bundle), libraries=False)}
    result = results[check_id]
    assert result.status is Status.FAIL, f"{check_id} did not fail: {result.reason}"
    messages = [str(f) for f in result.findings]
    for text in expected:
        assert any(text in m for m in messages), f"{text!r} not in {messages}"
    if rehash:
        assert results["files.manifest"].status is Status.PASS


def test_library_checks_catch_a_mismatch_the_trainer_would_refuse(built: dict[str, Path], tmp_path: Path) -> None:
    needs("transformers", "deepspeed")
    bundle = _copy(built["llama"], tmp_path / "llama")
    edit_json("ds_config.json", lambda d: _set(d, "gradient_accumulation_steps", 4))(bundle)
    edit_yaml("recipe.yaml", lambda d: _set(d["training_arguments"], "warmup_stepz", 3))(bundle)
    rehash_manifest(bundle)
    results = {r.id: r for r in run_static(load_bundle(bundle), libraries=True)}
    transformers_messages = [str(f) for f in results["library.transformers"].findings]
    assert results["library.transformers"].status is Status.FAIL
    assert any(
        "recipe.yaml training_arguments.warmup_stepz" in m and "no such argument" in m for m in transformers_messages
    ), transformers_messages
    assert results["library.deepspeed"].status is Status.FAIL
    assert any(
        "ds_config.json train_batch_size" in str(f) and "128 != 2 * 4 * 8" in str(f)
        for f in results["library.deepspeed"].findings
    ), results["library.deepspeed"].findings


def test_library_checks_report_each_trainer_mismatch(built: dict[str, Path], tmp_path: Path) -> None:
    needs("transformers")
    bundle = _copy(built["tiny"], tmp_path / "tiny")
    edit_json("ds_config.json", lambda d: _set(d, "gradient_clipping", 0.5))(bundle)
    rehash_manifest(bundle)
    results = {r.id: r for r in run_static(load_bundle(bundle), libraries=True)}
    messages = [str(f) for f in results["library.transformers"].findings]
    assert any(
        m.startswith("ds_config.json gradient_clipping: 0.5, but the Trainer computes max_grad_norm = 1.0")
        for m in messages
    ), messages


# ------------------------------------------------------------------------------------------- Volcano rules alone
@pytest.mark.parametrize(
    "policies, expected",
    [
        ([{"event": "PodFailed", "action": "RestartJob"}], None),
        (
            [{"events": ["PodFailed", "PodEvicted"], "action": "RestartJob"}, {"exitCode": 3, "action": "AbortJob"}],
            None,
        ),
        ([{"event": "PodFailed", "exitCode": 1, "action": "RestartJob"}], "event and exitCode together"),
        ([{"action": "RestartJob"}], "neither event nor exitCode"),
        ([{"exitCode": 0, "action": "RestartJob"}], "0 is not a valid error code"),
        ([{"exitCode": 2, "action": "RestartJob"}, {"exitCode": 2, "action": "AbortJob"}], "duplicate exitCode 2"),
        (
            [{"event": "PodFailed", "action": "RestartJob"}, {"events": ["PodFailed"], "action": "AbortJob"}],
            "duplicate event",
        ),
        (
            [{"event": "*", "action": "RestartJob"}, {"event": "PodEvicted", "action": "AbortJob"}],
            "'*' must be the only",
        ),
        ([{"event": "OutOfSync", "action": "RestartJob"}], "invalid policy event"),
        ([{"event": "PodFailed", "action": "SyncJob"}], "invalid policy action"),
    ],
)
def test_policy_rules(policies: list, expected: str | None) -> None:
    messages = [str(f) for f in policy_findings(policies, "spec.policies")]
    if expected is None:
        assert messages == []
    else:
        assert any(expected in m for m in messages), messages


def test_schema_accepts_every_core_field_and_rejects_others() -> None:
    job = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "n"},
        "spec": {
            "schedulerName": "volcano",
            "minAvailable": 1,
            "queue": "q",
            "maxRetry": 3,
            "ttlSecondsAfterFinished": 60,
            "priorityClassName": "p",
            "minSuccess": 1,
            "runningEstimate": "2h",
            "volumes": [{"mountPath": "/m", "volumeClaimName": "c"}],
            "plugins": {"env": [], "svc": ["--x"]},
            "policies": [{"event": "PodFailed", "action": "RestartJob", "timeout": "5m"}],
            "tasks": [
                {
                    "name": "w",
                    "replicas": 1,
                    "minAvailable": 1,
                    "template": {},
                    "maxRetry": 2,
                    "topologyPolicy": "none",
                    "policies": [{"exitCode": 3, "action": "AbortJob"}],
                    "dependsOn": {"name": ["x"], "iteration": "any"},
                }
            ],
        },
    }
    assert schema_findings(job) == []
    job["spec"]["errorHandling"] = {}
    job["spec"]["tasks"][0]["replicas"] = 1.5
    messages = [str(f) for f in schema_findings(job)]
    assert any("spec.errorHandling: unknown field" in m for m in messages)
    assert any("spec.tasks[0].replicas: must be a 32-bit integer" in m for m in messages)


def test_webhook_rejects_a_dependency_cycle() -> None:
    job = {
        "metadata": {"name": "j"},
        "spec": {
            "tasks": [
                {"name": "a", "replicas": 1, "dependsOn": {"name": ["b"]}},
                {"name": "b", "replicas": 1, "dependsOn": {"name": ["a"]}},
            ]
        },
    }
    assert any("directed acyclic graph" in str(f) for f in webhook_findings(job))


# ------------------------------------------------------------------------------------------------------ the CLI
def invoke(*args: str):
    return CliRunner().invoke(validate_command, list(args))


def test_cli_exit_0_on_a_good_bundle(built: dict[str, Path]) -> None:
    result = invoke(str(built["tiny"]))
    assert result.exit_code == 0, result.output
    assert "files.manifest" in result.stdout and "passed, 0 failed" in result.stdout


def test_cli_exit_1_names_the_file_and_field(built: dict[str, Path], tmp_path: Path) -> None:
    bundle = _copy(built["tiny"], tmp_path / "b")
    edit_json("launch.json", lambda d: _set(d, "master_port", 29501))(bundle)
    result = invoke(str(bundle))
    assert result.exit_code == 1, result.output
    assert "launch.json: edited after the build" in result.stdout
    assert "launch.json master_port: 29501" in result.stdout and "Traceback" not in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["{missing}"], "no such directory"),
        (["{file}"], "not a directory"),
        (["{empty}"], "no manifest.json"),
        (["{broken_manifest}"], "not UTF-8 JSON"),
        (["{good}", "--kill-pod", "1"], "--kill-pod only makes sense with --dry-run"),
        (["{good}", "--dry-run", "--kill-pod", "5"], "pods are numbered 0..1"),
        (["{good}", "--dry-run", "--kill-pod", "0", "--at-step", "8"], "--at-step 8"),
        (["{good}", "--dry-run", "--at-step", "3"], "--at-step needs --kill-pod"),
        (["{good}", "--dry-run", "--pods", "0"], "0"),
        (["{good}", "--device", "tpu"], "tpu"),
        # issue 41: a dry run on a device this machine lacks did not run: one line, exit 2, never "bundle OK"
        (["{good}", "--dry-run", "--device", "npu"], "--device npu: no usable npu device here"),
    ],
)
def test_cli_exit_2_for_unusable_input(built: dict[str, Path], tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "broken_manifest").mkdir()
    (tmp_path / "broken_manifest" / "manifest.json").write_text("{")
    paths = {
        "missing": tmp_path / "nope",
        "file": tmp_path / "file",
        "empty": tmp_path / "empty",
        "broken_manifest": tmp_path / "broken_manifest",
        "good": built["tiny"],
    }
    result = invoke(*[a.format(**{k: str(v) for k, v in paths.items()}) for a in args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output and "bundle OK" not in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1 or "npu" not in args
    assert not (built["tiny"].parent / ".dryrun").exists()


def test_the_verdict_says_ok_only_for_the_checks_that_ran() -> None:
    """Issue 41: a skipped check is named in the verdict line; OK covers the checks that ran, nothing more."""
    verdict = Verdict("b", [Result("a", "a"), Result("dryrun.train", "t").skip("torch not installed")])
    assert verdict.summary() == (
        "1 passed, 0 failed, 1 skipped: bundle OK in the 1 checks that ran; not run: dryrun.train"
    )
    verdict.results[0].fail("f", "k", "wrong")
    assert verdict.summary().endswith(": bundle has problems")
    assert Verdict("b", [Result("a", "a")]).summary() == "1 passed, 0 failed, 0 skipped: bundle OK"


def test_cli_json_shape(built: dict[str, Path]) -> None:
    result = invoke(str(built["llama"]), "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert set(document) == {"bundle", "ok", "exit_code", "summary", "not_run", "warnings", "checks"}
    assert document["not_run"] == [c["id"] for c in document["checks"] if c["status"] == "skipped"]
    assert document["ok"] is True and document["exit_code"] == 0
    assert set(document["summary"]) == {"pass", "fail", "skipped"}
    for check in document["checks"]:
        assert set(check) == {"id", "title", "status", "reason", "seconds", "findings", "details"}
        assert check["status"] in ("pass", "fail", "skipped")
    assert document["summary"]["pass"] == sum(c["status"] == "pass" for c in document["checks"])


def test_cli_json_findings_carry_file_and_field(built: dict[str, Path], tmp_path: Path) -> None:
    bundle = _copy(built["tiny"], tmp_path / "b")
    edit_yaml("volcano-job.yaml", lambda j: _set(task(j), "minAvailable", 3))(bundle)
    rehash_manifest(bundle)
    document = json.loads(invoke(str(bundle), "--json").stdout)
    assert document["exit_code"] == 1
    webhook = next(c for c in document["checks"] if c["id"] == "volcano.webhook")
    assert webhook["status"] == "fail"
    assert {"file": "volcano-job.yaml", "field": "spec.tasks[0].minAvailable"}.items() <= webhook["findings"][0].items()


def test_validate_raises_for_a_non_bundle(tmp_path: Path) -> None:
    with pytest.raises(BundleUnusable):
        validate(tmp_path)
