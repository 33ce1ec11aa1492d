"""Experiment trackers in a bundle (bundle/trackers.py, image/matrix.py ``trackers``): pinned in the image only when
asked for, configured in launch.json, credentials only by ``secretKeyRef``; a recipe without one builds what it built
before trackers existed (the goldens, byte for byte, and the image tag, below)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from recipekit.bundle.build import resolve
from recipekit.bundle.files import DOCKERFILE, JOB, LAUNCH, MANIFEST, RECIPE
from recipekit.image.stack import stack_digest
from recipekit.validate.shared.loader import Bundle
from recipekit.validate.static.structure import check_job_schema, check_pod_template
from tests.conftest import render_files

ONLINE = ["train.tracking.secret=tracker-keys", "train.tracking.mlflow_uri=https://mlflow.example.com"]


def _container(files: dict[str, bytes]) -> dict:
    job = yaml.safe_load(files[JOB])
    return job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]


def test_the_tracker_pins_move_no_image_of_a_recipe_without_a_tracker() -> None:
    resolved = resolve(["recipe=tiny_sft"])
    family, recipe = resolved.plan.family, resolved.recipe
    bare = dataclasses.replace(family, trackers={})
    name = resolved.plan.image_family
    assert stack_digest(recipe, name, family, True) == stack_digest(recipe, name, bare, True)
    files = render_files(["recipe=tiny_sft"])
    assert b"wandb" not in files[DOCKERFILE] and b"tracking" not in files[RECIPE]
    assert b"WANDB" not in files[LAUNCH] and b"secretKeyRef" not in files[JOB]


PINS = [("wandb", "wandb==0.31.0"), ("mlflow", "mlflow-skinny==3.18.0"), ("swanlab", "swanlab==0.7.20")]


@pytest.mark.parametrize(("tracker", "pin"), PINS)
def test_a_tracker_is_pinned_in_the_image_of_the_recipes_that_ask(tracker: str, pin: str) -> None:
    plain = resolve(["recipe=tiny_sft"]).plan.image
    asked = [f"train.report_to=[tensorboard,{tracker}]", *ONLINE]
    assert resolve(["recipe=tiny_sft", *asked]).plan.image != plain  # another stack: another image
    files = render_files(["recipe=tiny_sft", *asked])
    assert pin.encode() in files[DOCKERFILE]
    name, version = pin.split("==")
    assert json.loads(files[MANIFEST])["versions"][name] == version


def test_the_ascend_image_pins_clients_that_keep_canns_protobuf() -> None:
    files = render_files(["recipe=llama3_8b_sft", "train.report_to=[wandb,mlflow,swanlab]", *ONLINE])
    for pin in (b"wandb==0.25.0", b"mlflow-skinny==3.18.0", b"swanlab==0.7.20", b"protobuf==3.20.0"):
        assert pin in files[DOCKERFILE]


def test_launch_json_says_where_each_tracker_sends_the_run() -> None:
    files = render_files(["recipe=tiny_sft", "train.report_to=[wandb,mlflow,swanlab]", *ONLINE])
    env, output = json.loads(files[LAUNCH])["env"], yaml.safe_load(files[RECIPE])["training_arguments"]["output_dir"]
    assert env["WANDB_MODE"] == "online" and env["WANDB_DIR"] == output and env["WANDB_PROJECT"] == "tiny_sft"
    assert env["MLFLOW_TRACKING_URI"] == "https://mlflow.example.com" and env["MLFLOW_EXPERIMENT_NAME"] == "tiny_sft"
    assert env["SWANLAB_MODE"] == "cloud" and "MLFLOW_ALLOW_FILE_STORE" not in env
    offline = render_files(["recipe=tiny_sft", "train.report_to=[wandb,mlflow,swanlab]", "train.tracking.mode=offline"])
    env = json.loads(offline[LAUNCH])["env"]
    assert env["WANDB_MODE"] == "offline" and env["SWANLAB_MODE"] == "offline"
    assert env["MLFLOW_TRACKING_URI"] == f"file://{output}/mlruns" and env["MLFLOW_ALLOW_FILE_STORE"] == "true"
    assert env["SWANLAB_LOG_DIR"] == f"{output}/swanlog"


def test_credentials_come_from_the_secret_by_reference_only() -> None:
    files = render_files(["recipe=tiny_sft", "train.report_to=[wandb,mlflow]", *ONLINE])
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in _container(files)["env"] if "valueFrom" in e}
    mlflow = {"MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"}
    assert set(refs) == {"WANDB_API_KEY", *mlflow}
    assert all(ref == {"name": "tracker-keys", "key": name, "optional": True} for name, ref in refs.items())
    bundle = Bundle(None, files, json.loads(files[MANIFEST]))  # type: ignore[arg-type]
    bundle.job = yaml.safe_load(files[JOB])
    for check in (check_job_schema, check_pod_template):
        result = check(bundle)
        assert not result.failed, result.findings


def test_tracking_settings_without_a_tracker_are_a_warning() -> None:
    plan = resolve(["recipe=tiny_sft", "train.tracking.project=nlp"]).plan
    assert any("train.tracking is set" in w for w in plan.warnings)
