"""The ``train`` section: optimisation and bookkeeping (steps, learning rate, precision, checkpoints, trackers)."""

from __future__ import annotations

from typing import Literal

from recipekit.recipe.domains import DNS_SUBDOMAIN, HOST_PATH, INDEX_URL, MOUNT_PATH
from recipekit.recipe.schema import Section, pattern_domain, spec
from recipekit.recipe.sections.model import MAX_COUNT

#: The experiment trackers a bundle wires (train.report_to), each installed in the image only when asked for.
TRACKERS = ("wandb", "mlflow", "swanlab")
#: A tracker's project or entity name: one word of the characters the three services accept in names.
TRACKER_NAME = pattern_domain(
    "tracker name",
    "at most 128 letters, digits, '.', '_' and '-', starting with a letter or digit",
    r"[A-Za-z0-9][A-Za-z0-9._-]*",
    max_length=128,
)


# ------------------------------------------------------------------------------------------------------ tracking
class TrackingSpec(Section):
    """Where the experiment trackers of ``report_to`` send the run (W&B, MLflow, SwanLab).

    Credentials never enter the bundle: the Job reads them from the Kubernetes Secret ``secret`` names (keys
    WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD, SWANLAB_API_KEY; each
    optional). A tracker that is down never stops training: the runtime turns it off for the run and says so.
    """

    mode: Literal["online", "offline"] = spec(
        "online",
        description="online: send to the tracker's server; offline: write the tracker's files under output_dir "
        "(wandb/, mlruns/, swanlog/) to sync later (air-gapped clusters; the dry run always runs offline).",
    )
    project: str | None = spec(
        None,
        domain=TRACKER_NAME,
        description="W&B project, MLflow experiment, SwanLab project (default: the recipe's name).",
    )
    secret: str | None = spec(
        None,
        domain=DNS_SUBDOMAIN,
        description="Kubernetes Secret in the Job's namespace holding the trackers' credentials (see above).",
    )
    wandb_entity: str | None = spec(None, domain=TRACKER_NAME, description="W&B entity (team or user).")
    wandb_host: str | None = spec(
        None, domain=INDEX_URL, description="W&B server of a self-hosted install (WANDB_BASE_URL)."
    )
    mlflow_uri: str | None = spec(
        None, domain=INDEX_URL, description="MLflow tracking server (MLFLOW_TRACKING_URI); needed online."
    )
    swanlab_host: str | None = spec(
        None, domain=INDEX_URL, description="SwanLab server of a private deployment (its web address)."
    )


# ---------------------------------------------------------------------------------------------------- hot tier
class HotCheckpointsSpec(Section):
    """Checkpoints written first to node-local storage (the hot tier), then drained to the shared volume in the
    background, so training waits for a local disk rather than for the volume (docs/operations.md, "Checkpoints
    that do not stall training").

    ``medium: hostPath`` keeps the hot tier on the node across pod restarts: a restarted Job placed on the same node
    resumes from it when it is newer than the shared volume's copy. An ``emptyDir`` is deleted with its pod (every
    Volcano restart), so it only takes the volume's time off the step; its copy is never resumed from.
    """

    medium: Literal["none", "hostPath", "emptyDir"] = spec(
        "none",
        description="none: checkpoints go straight to the shared volume, as the Trainer writes them; hostPath or "
        "emptyDir: first to node-local storage, then drained to the shared volume in the background.",
    )
    mount_path: str = spec(
        "/var/lib/recipekit/hot",
        domain=MOUNT_PATH,
        description="Where the pod mounts the node-local storage.",
    )
    host_path: str = spec(
        "/var/lib/recipekit/hot",
        domain=HOST_PATH,
        description="The node's directory (hostPath; a fast local NVMe disk).",
    )
    size_gib: int | None = spec(None, gt=0, le=1_048_576, description="emptyDir's sizeLimit in GiB (none: no limit).")
    keep: int = spec(
        1, ge=1, le=2, description="Checkpoints kept on the node (the shared volume keeps train.save_total_limit)."
    )


# --------------------------------------------------------------------------------------------------- cold tier
class ColdCheckpointsSpec(Section):
    """A copy of each checkpoint in a cold store (an object store), made by a command of the image after the
    checkpoint is signed on the shared volume, in the background: rank 0 runs it, one copy at a time, and training
    never waits for it (docs/operations.md, "The cold tier"). Retention there is the store's (its lifecycle rules).
    """

    command: list[str] = spec(
        default_factory=list,
        description="The command and its arguments, run without a shell; {checkpoint} (its directory on the shared "
        "volume), {name} (checkpoint-N), {step} and {run} (the run id) are filled in, e.g. [obsutil, cp, -r, -f, "
        "'{checkpoint}', 'obs://bucket/runs/{run}/'] or [aws, s3, sync, '{checkpoint}', "
        "'s3://bucket/runs/{run}/{name}']. Empty: no cold tier.",
    )
    every: int = spec(1, ge=1, le=1_000_000, description="Copy every Nth checkpoint saved (1: every one).")
    timeout_s: int = spec(
        3600, ge=10, le=7 * 86_400, description="A copy still running after this is stopped and counted a failure."
    )


# --------------------------------------------------------------------------------------------------------- train
class TrainSpec(Section):
    """Optimisation and bookkeeping; the Trainer arguments are derived from these by the plan."""

    micro_batch_size: int = spec(1, gt=0, le=65_536, description="Sequences per device per step.")
    gradient_accumulation_steps: int | None = spec(
        None,
        gt=0,
        le=1_048_576,
        description="Micro-steps per optimizer step; derived from global_batch_size when unset.",
    )
    global_batch_size: int | None = spec(
        None, gt=0, le=2**30, description="Sequences per optimizer step across all devices."
    )
    epochs: float = spec(1.0, gt=0, le=1e6, description="Passes over the data (ignored when max_steps is set).")
    max_steps: int | None = spec(None, gt=0, le=MAX_COUNT, description="Optimizer steps; overrides epochs.")
    learning_rate: float = spec(2e-5, gt=0, lt=1, description="Peak learning rate.")
    lr_scheduler: Literal["cosine", "linear", "constant_with_warmup"] = spec("cosine", description="LR schedule.")
    warmup_ratio: float = spec(0.03, ge=0, lt=1, description="Fraction of steps spent warming up.")
    weight_decay: float = spec(0.0, ge=0, le=100, description="AdamW weight decay.")
    max_grad_norm: float = spec(1.0, gt=0, le=1e6, description="Gradient clipping norm.")
    precision: Literal["auto", "bf16", "fp16", "fp32", "fp8"] = spec(
        "auto",
        description="auto: bf16 where supported; fp8: bf16 weights with FP8 matrix multiplies where the hardware has "
        "FP8 (hw.peak_tflops_fp8; analysed by plan only).",
    )
    save_steps: int = spec(500, gt=0, le=MAX_COUNT, description="Checkpoint every N optimizer steps.")
    save_total_limit: int = spec(3, gt=0, le=100_000, description="Checkpoints kept (oldest deleted first).")
    hot_checkpoints: HotCheckpointsSpec = spec(
        default_factory=HotCheckpointsSpec,
        omit_default=True,
        description="A node-local hot tier for checkpoints, drained to the shared volume in the background.",
    )
    cold_checkpoints: ColdCheckpointsSpec = spec(
        default_factory=ColdCheckpointsSpec,
        omit_default=True,
        description="A copy of checkpoints in a cold store (an object store), by a command of the image.",
    )
    logging_steps: int = spec(10, gt=0, le=MAX_COUNT, description="Log every N optimizer steps.")
    seed: int = spec(42, ge=0, le=2**32 - 1, description="Random seed (NumPy's seeds are 32-bit).")
    report_to: list[Literal["tensorboard", "wandb", "mlflow", "swanlab", "none"]] = spec(
        default_factory=lambda: ["tensorboard"],
        description="Trackers the Trainer reports to; wandb, mlflow and swanlab are installed in the image only "
        "when listed, and sent where train.tracking says.",
    )
    tracking: TrackingSpec = spec(
        default_factory=TrackingSpec,
        omit_default=True,
        description="Where wandb, mlflow and swanlab send the run, and the Secret with their credentials.",
    )
    dataloader_workers: int = spec(4, ge=0, le=1024, description="DataLoader worker processes per device.")
    profile_steps: tuple[int, int] | None = spec(
        None,
        description="[first, last]: record a torch profiler trace (torch_npu's on Ascend) of these optimizer steps "
        "into output_dir/profile/ (keep the window short: a trace grows by megabytes per step).",
    )

    def rules(self) -> list[str | tuple[str, str]]:
        broken: list[str | tuple[str, str]] = []
        if self.profile_steps is not None:
            first, last = self.profile_steps
            if not 1 <= first <= last:
                broken.append(f"profile_steps {list(self.profile_steps)}: need 1 <= first <= last (steps count from 1)")
        return broken + self._tracking_rules()

    def _tracking_rules(self) -> list[str | tuple[str, str]]:
        """What an online tracker cannot do without: MLflow its server, W&B and SwanLab an API key."""
        tracking, broken = self.tracking, list[str | tuple[str, str]]()
        if "none" in self.report_to and len(self.report_to) > 1:
            broken.append(("report_to", f"{self.report_to}: 'none' together with trackers; list the trackers alone"))
        if tracking.mode == "offline":
            return broken
        if "mlflow" in self.report_to and tracking.mlflow_uri is None:
            broken.append(
                (
                    "tracking",
                    "mlflow online needs its server: set tracking.mlflow_uri (http(s)://...), or tracking.mode=offline "
                    "(MLflow's file store under output_dir/mlruns)",
                )
            )
        for tracker, key in (("wandb", "WANDB_API_KEY"), ("swanlab", "SWANLAB_API_KEY")):
            if tracker in self.report_to and tracking.secret is None:
                broken.append(
                    (
                        "tracking",
                        f"{tracker} online needs an API key: set tracking.secret to the Secret holding {key} "
                        f"(kubectl create secret generic NAME --from-literal={key}=...), or tracking.mode=offline",
                    )
                )
        return broken
