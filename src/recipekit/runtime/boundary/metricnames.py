"""The names of the metrics a run serves for Prometheus, written down once. Standard library only.

The runtime's exporter (exporter.py) creates exactly these; recipekit's monitoring module builds the PrometheusRule's
alerts and the Grafana dashboard from the same names (it imports this module as
``recipekit.runtime.boundary.metricnames``); the dry run scrapes a pod and checks that every name is served. A renamed
metric therefore breaks a test, not a dashboard nobody looks at.

Every series carries the labels :data:`LABELS`: the Job's name (Prometheus's own ``job`` label names the scrape
job, so the run's is ``recipekit_job``) and the process's global rank.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Labels on every series: the Volcano Job's name and the process's global rank.
#: The pod's environment may set the first metrics port (the dry run's pods share one host).
PORT_ENV = "RECIPEKIT_METRICS_PORT"

JOB_LABEL = "recipekit_job"
RANK_LABEL = "rank"
LABELS = (JOB_LABEL, RANK_LABEL)
#: The extra label of :data:`ALERTS`: which in-process alert fired.
ALERT_LABEL = "alert"
#: The in-process alert of a checkpoint the cold tier's command did not copy (runtime/volume/coldtier.py).
COLD_COPY_FAILED = "checkpoint_cold_failed"
#: The extra label of :data:`LOG_EVENTS` and :data:`LOG_EVENT_TIME`: which kind of fault a log line named.
KIND_LABEL = "kind"
#: Its values (runtime/ops/logevents.py holds the keywords of each).
LOG_EVENT_KINDS = ("collective_timeout", "device_ecc", "device_oom")


@dataclass(frozen=True)
class Metric:
    name: str
    help: str
    unit: str = ""  # Grafana's unit id for the dashboard panel
    kind: str = "gauge"  # gauge | counter
    label: str = ""  # a label of its own beyond LABELS (ALERT_LABEL, KIND_LABEL)


STEP = Metric("recipekit_step", "Last completed optimizer step.", "none")
LAST_STEP_TIME = Metric(
    "recipekit_last_step_timestamp_seconds", "Unix time the last optimizer step completed.", "dateTimeAsIso"
)
STEP_TIME = Metric("recipekit_step_time_seconds", "Wall time of the last optimizer step.", "s")
TOKENS_PER_S = Metric(
    "recipekit_tokens_per_second_per_device", "Tokens per second per device over the last logging interval.", "none"
)
TFLOPS = Metric("recipekit_tflops_per_device", "Achieved model TFLOP/s per device.", "none")
MFU = Metric("recipekit_mfu", "Model FLOPs utilisation (0-1) against the device's peak.", "percentunit")
HFU = Metric("recipekit_hfu", "Hardware FLOPs utilisation (0-1): MFU plus recomputation.", "percentunit")
LOSS = Metric("recipekit_loss", "Training loss of the last logging step.", "none")
LOSS_JUMP = Metric(
    "recipekit_loss_jump_ratio", "Relative rise of the loss since the previous logging step (0.3 = 30%).", "percentunit"
)
GRAD_NORM = Metric("recipekit_grad_norm", "Gradient norm before clipping.", "none")
GRAD_NORM_JUMP = Metric(
    "recipekit_grad_norm_jump_ratio",
    "Relative change of the gradient norm since the previous logging step (either way: -0.3 = 30% lower).",
    "percentunit",
)
LEARNING_RATE = Metric("recipekit_learning_rate", "Learning rate.", "none")
MFU_LOW_STEPS = Metric("recipekit_mfu_low_steps", "Logging steps in a row with MFU below the target.", "none")
CHECKPOINT_SECONDS = Metric(
    "recipekit_checkpoint_seconds",
    "Seconds training stood still for the last checkpoint save (with a hot tier: the node-local write).",
    "s",
)
CHECKPOINT_TOTAL_SECONDS = Metric(
    "recipekit_checkpoint_total_seconds",
    "Seconds from the last checkpoint's save to its signed copy on the shared volume (hot tier: plus the drain).",
    "s",
)
CHECKPOINT_BYTES = Metric("recipekit_checkpoint_size_bytes", "Size of the last checkpoint on disk.", "bytes")
DATALOADER_WAIT = Metric(
    "recipekit_dataloader_wait_fraction", "Share of the last step spent waiting for the next batch.", "percentunit"
)
DEVICE_UTILISATION = Metric(
    "recipekit_device_utilisation", "Device utilisation (0-1) as the driver reports it (absent on CPU).", "percentunit"
)
ALERTS = Metric(
    "recipekit_alerts_total", "In-process alerts raised, by alert.", "none", kind="counter", label=ALERT_LABEL
)
#: Log keywords (runtime/ops/logevents.py): counted from this process's log records and its fatal error's text, kept
#: in the run directory so that the restarted process serves what the failed one saw.
LOG_EVENTS = Metric(
    "recipekit_log_events_total",
    "Log lines or errors of this rank naming a known fault (collective_timeout, device_ecc, device_oom), this run.",
    "none",
    kind="counter",
    label=KIND_LABEL,
)
LOG_EVENT_TIME = Metric(
    "recipekit_log_event_timestamp_seconds",
    "Unix time a log line or error of this rank last named this kind of fault.",
    "dateTimeAsIso",
    label=KIND_LABEL,
)
#: MTTR in production (runtime/volume/recovery.py, from the run directory's recovery.jsonl; rank 0 reads it).
RECOVERY_SECONDS = Metric(
    "recipekit_recovery_seconds",
    "Last recovery: last step before the interruption to the first step after the restart (0: none yet).",
    "s",
)
RESTARTS = Metric("recipekit_restarts", "Interruptions this run recovered from (restarts that resumed).", "none")
STEPS_LOST = Metric("recipekit_steps_lost", "Optimizer steps done twice: interrupted step minus resumed step.", "none")

#: Every metric, in dashboard order.
METRICS = (
    STEP,
    LAST_STEP_TIME,
    STEP_TIME,
    TOKENS_PER_S,
    TFLOPS,
    MFU,
    HFU,
    LOSS,
    LOSS_JUMP,
    GRAD_NORM,
    GRAD_NORM_JUMP,
    LEARNING_RATE,
    MFU_LOW_STEPS,
    CHECKPOINT_SECONDS,
    CHECKPOINT_TOTAL_SECONDS,
    CHECKPOINT_BYTES,
    DATALOADER_WAIT,
    DEVICE_UTILISATION,
    ALERTS,
    LOG_EVENTS,
    LOG_EVENT_TIME,
    RECOVERY_SECONDS,
    RESTARTS,
    STEPS_LOST,
)

#: Metrics only where the driver reports them (no utilisation on a CPU, nor without NVML): a scrape may lack them.
DEVICE_ONLY = (DEVICE_UTILISATION,)
#: Metrics with a series only once something happened (an alert raised, a fault named in the log).
ON_EVENT = (ALERTS, LOG_EVENTS, LOG_EVENT_TIME)
#: Metrics of the whole run that global rank 0 alone measures (the checkpoint directory holds every rank's shards).
RANK0_ONLY = (CHECKPOINT_BYTES, CHECKPOINT_TOTAL_SECONDS, RECOVERY_SECONDS, RESTARTS, STEPS_LOST)
