"""What a bundle wires for the experiment trackers of ``train.report_to`` (W&B, MLflow, SwanLab).

The Trainer's own integrations do the reporting (transformers' ``WandbCallback``, ``MLflowCallback``,
``SwanLabCallback``); they read everything from the environment, so a tracker is three things here: its client pinned
in the image (image/matrix.py ``tracker_pins``), its settings in launch.json's environment (this module; run files,
covered by their digest) and its credentials in the pod's environment from the Kubernetes Secret
``train.tracking.secret`` names, by ``secretKeyRef`` (never in the bundle). Every key is optional in the Secret: a
missing key leaves the variable unset, the tracker then fails to log in, and the runtime turns it off for the run
instead of failing the pod (runtime/ops/trackers/guarded.py).

Offline (``train.tracking.mode=offline``, and always in the dry run) each tracker writes its files under the run's
output directory, for ``wandb sync``, ``swanlab sync`` or MLflow's file store: ``wandb/``, ``mlruns/``, ``swanlog/``.
A recipe without a tracker gets none of this: its launch.json and Job are what they were before trackers existed.
"""

from __future__ import annotations

import json
from typing import Any

from recipekit.recipe.sections import TRACKERS, Recipe

#: Each tracker's directory under the output directory when it writes offline.
OFFLINE_DIRS = {"wandb": "wandb", "mlflow": "mlruns", "swanlab": "swanlog"}
#: The Secret's keys each tracker reads (each the environment variable of the same name), all optional.
SECRET_KEYS = {
    "wandb": ("WANDB_API_KEY",),
    "mlflow": ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"),
    "swanlab": ("SWANLAB_API_KEY",),
}
#: Seconds a tracker's server may take per request before the client gives up (MLflow retries this often): a server
#: that is down costs minutes at most, never the run.
REQUEST_TIMEOUT_S = 30
REQUEST_RETRIES = 3


def trackers_of(recipe: Recipe) -> list[str]:
    """The trackers of ``train.report_to`` a bundle wires, in its order (not tensorboard: it needs nothing)."""
    return [name for name in recipe.train.report_to if name in TRACKERS]


def tracker_env(recipe: Recipe, output_dir: str, run_id: str) -> dict[str, str]:
    """launch.json's environment for the trackers the recipe reports to (empty without one): mode, project, server,
    where offline files go, and how long a request may take."""
    trackers = trackers_of(recipe)
    tracking = recipe.train.tracking
    project, offline = tracking.project or recipe.name, tracking.mode == "offline"
    env: dict[str, str] = {}
    if "wandb" in trackers:
        env.update(
            WANDB_MODE="offline" if offline else "online",
            WANDB_DIR=output_dir,  # W&B adds wandb/ itself
            WANDB_PROJECT=project,
            WANDB_RUN_GROUP=run_id,  # every attempt of one run in one group
            WANDB_INIT_TIMEOUT=str(4 * REQUEST_TIMEOUT_S),
        )
        if tracking.wandb_entity:
            env["WANDB_ENTITY"] = tracking.wandb_entity
        if tracking.wandb_host and not offline:
            env["WANDB_BASE_URL"] = tracking.wandb_host
    if "mlflow" in trackers:
        env.update(
            MLFLOW_EXPERIMENT_NAME=project,
            MLFLOW_TAGS=json.dumps({"recipekit.run": run_id}),
            MLFLOW_HTTP_REQUEST_TIMEOUT=str(REQUEST_TIMEOUT_S),
            MLFLOW_HTTP_REQUEST_MAX_RETRIES=str(REQUEST_RETRIES),
        )
        if offline:  # MLflow 3 keeps the file store only on request (it is in maintenance mode)
            env.update(
                MLFLOW_TRACKING_URI=f"file://{output_dir}/{OFFLINE_DIRS['mlflow']}", MLFLOW_ALLOW_FILE_STORE="true"
            )
        elif tracking.mlflow_uri:
            env["MLFLOW_TRACKING_URI"] = tracking.mlflow_uri
    if "swanlab" in trackers:
        env.update(
            SWANLAB_MODE="offline" if offline else "cloud",
            SWANLAB_LOG_DIR=f"{output_dir}/{OFFLINE_DIRS['swanlab']}",
            # SwanLab's own variable for it (transformers' SwanLabCallback reads SWANLAB_PROJECT itself, but swanlab
            # 0.8 and later parse that one as a settings section and refuse a plain name)
            SWANLAB_PROJ_NAME=project,
        )
        if tracking.swanlab_host and not offline:  # a private deployment: its web address, its API below it
            host = tracking.swanlab_host.rstrip("/")
            env.update(SWANLAB_WEB_HOST=host, SWANLAB_API_HOST=f"{host}/api")
    return env


def secret_env(recipe: Recipe) -> list[dict[str, Any]]:
    """The trainer container's credentials: one ``secretKeyRef`` per key the trackers read, each optional (empty
    without a tracker or without ``train.tracking.secret``)."""
    secret = recipe.train.tracking.secret
    if secret is None:
        return []
    return [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}
        for tracker in trackers_of(recipe)
        for key in SECRET_KEYS[tracker]
    ]
