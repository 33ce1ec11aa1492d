"""The bundle's monitoring documents, as dicts the renderer serialises: a PodMonitor that makes the Prometheus
Operator scrape the Job's pods, a PrometheusRule with the alerts, and a Grafana dashboard.

Metric names come from the runtime's :mod:`~recipekit.runtime.boundary.metricnames` (what the exporter serves),
thresholds from :mod:`~recipekit.memory.operations` (what the in-process alerts use), the selector and port names from
the Job's own pod labels and container ports: one source for each, so a scrape target, an alert and a panel cannot drift
apart. Every expression is scoped to this run with ``recipekit_job="<job name>"``. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from recipekit.bundle import devicetelemetry
from recipekit.bundle.documents import job_labels, metrics_port_names
from recipekit.memory.operations import Operations
from recipekit.plan.plan import Plan
from recipekit.recipe.sections import Recipe
from recipekit.runtime.boundary import metricnames

MONITORING_API = "monitoring.coreos.com/v1"
#: How often Prometheus scrapes each process.
SCRAPE_INTERVAL = "15s"


def _selector(plan: Plan) -> str:
    return f'{metricnames.JOB_LABEL}="{plan.job_name}"'


def pod_monitor(recipe: Recipe, plan: Plan, ops: Operations) -> dict[str, Any]:
    """monitoring.coreos.com/v1 PodMonitor: every metrics port of every pod of this Job."""
    labels = {"app.kubernetes.io/name": plan.job_name, "app.kubernetes.io/managed-by": "recipekit"}
    return {
        "apiVersion": MONITORING_API,
        "kind": "PodMonitor",
        "metadata": {
            "name": plan.job_name,
            "namespace": recipe.cluster.namespace,
            "labels": {**labels, **recipe.ops.monitor_labels},
        },
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": job_labels(plan)["app.kubernetes.io/name"]}},
            "namespaceSelector": {"matchNames": [recipe.cluster.namespace]},
            "podMetricsEndpoints": [
                {"port": name, "path": "/metrics", "interval": SCRAPE_INTERVAL}
                for name in metrics_port_names(ops.metrics_ports)
            ],
        },
    }


def alert_rules(recipe: Recipe, plan: Plan, ops: Operations) -> list[dict[str, Any]]:
    """The alerts, with the thresholds the in-process warnings use."""
    sel, a, loss = _selector(plan), recipe.ops, metricnames.LOSS.name
    low_for = f"{max(1, round(a.mfu_low_steps * max(ops.planned_step_time_s, 1) / 60))}m"

    def rule(alert: str, expr: str, severity: str, summary: str, duration: str = "0m") -> dict[str, Any]:
        return {
            "alert": alert,
            "expr": expr,
            "for": duration,
            "labels": {"severity": severity, metricnames.JOB_LABEL: plan.job_name},
            "annotations": {"summary": summary, "description": f"{summary} (rank {{{{ $labels.rank }}}})"},
        }

    return [
        rule(
            "RecipekitLossNotFinite",
            f"{loss}{{{sel}}} != {loss}{{{sel}}} or abs({loss}{{{sel}}}) == +Inf",
            "critical",
            "the training loss is NaN or infinite: the run stops without saving the poisoned weights",
        ),
        rule(
            "RecipekitLossSpike",
            f"{metricnames.LOSS_JUMP.name}{{{sel}}} > {a.loss_spike_ratio}",
            "warning",
            f"the loss rose more than {100 * a.loss_spike_ratio:.0f}% in one logged step",
        ),
        rule(
            "RecipekitGradNormJump",
            f"abs({metricnames.GRAD_NORM_JUMP.name}{{{sel}}}) > {a.grad_norm_jump_ratio}",
            "warning",
            f"the gradient norm changed more than {100 * a.grad_norm_jump_ratio:.0f}% (either way) in one logged step",
        ),
        rule(
            "RecipekitMfuLow",
            f"{metricnames.MFU_LOW_STEPS.name}{{{sel}}} >= {a.mfu_low_steps}",
            "warning",
            f"MFU below {ops.mfu_target:.3g} for {a.mfu_low_steps} logged steps",
        ),
        rule(
            "RecipekitCheckpointSlow",
            f"{metricnames.CHECKPOINT_SECONDS.name}{{{sel}}} > {a.checkpoint_save_limit_s}",
            "warning",
            f"saving a checkpoint took longer than {a.checkpoint_save_limit_s} s",
        ),
        rule(
            "RecipekitDeviceUtilisationLow",
            f"{metricnames.DEVICE_UTILISATION.name}{{{sel}}} < {a.device_utilisation_min}",
            "warning",
            f"device utilisation below {100 * a.device_utilisation_min:.0f}%",
            low_for,
        ),
        rule(
            "RecipekitStalled",
            f"time() - {metricnames.LAST_STEP_TIME.name}{{{sel}}} > {ops.stall_timeout_s}",
            "critical",
            f"no optimizer step for {ops.stall_timeout_s} s: the hang watchdog should have restarted the job",
        ),
        rule(
            "RecipekitRecoverySlow",
            f"{metricnames.RECOVERY_SECONDS.name}{{{sel}}} > {a.mttr_limit_s}",
            "warning",
            f"the last recovery took longer than {a.mttr_limit_s} s (MTTR: last step before the interruption to the "
            "first step after the restart); recipekit runs history says why the attempt ended",
        ),
        *_log_event_rules(recipe, plan, rule),
        *_cold_tier_rules(recipe, plan, rule),
        *_device_rules(recipe, plan),
    ]


def _cold_tier_rules(recipe: Recipe, plan: Plan, rule: Any) -> list[dict[str, Any]]:
    """A checkpoint the cold tier's command did not copy (train.cold_checkpoints), from the in-process alert's
    counter: once, for the hour after (the alert record in metrics.jsonl says why)."""
    if not recipe.train.cold_checkpoints.command:
        return []
    failed = f'{metricnames.ALERT_LABEL}="{metricnames.COLD_COPY_FAILED}"'
    expr = f"increase({metricnames.ALERTS.name}{{{_selector(plan)},{failed}}}[1h]) > 0"
    summary = "a checkpoint was not copied to the cold store (train.cold_checkpoints) in the last hour"
    return [rule("RecipekitColdCopyFailed", expr, "warning", summary)]


#: The alert of each log-event kind (metricnames.LOG_EVENT_KINDS): name, severity, what happened.
LOG_EVENT_ALERTS = {
    "collective_timeout": ("RecipekitCollectiveTimeout", "critical", "an HCCL/NCCL collective timed out"),
    "device_ecc": ("RecipekitDeviceEccError", "critical", "an ECC error or Xid was reported on the device"),
    "device_oom": ("RecipekitDeviceOutOfMemory", "warning", "the device ran out of memory"),
}


def _log_event_rules(recipe: Recipe, plan: Plan, rule: Any) -> list[dict[str, Any]]:
    """One alert per kind of fault a rank's log or fatal error named (runtime/ops/logevents.py), for
    ``ops.log_event_window_s`` after it: on the time, which the restarted process serves again, not on the counter,
    whose last increment dies with the failed process before Prometheus scrapes it."""
    window, found = recipe.ops.log_event_window_s, []
    for kind in metricnames.LOG_EVENT_KINDS:
        alert, severity, what = LOG_EVENT_ALERTS[kind]
        series = f'{metricnames.LOG_EVENT_TIME.name}{{{_selector(plan)},{metricnames.KIND_LABEL}="{kind}"}}'
        summary = f"{what} in the last {window} s (pod {{{{ $labels.pod }}}}; the pod's log says which step)"
        found.append(rule(alert, f"time() - {series} < {window}", severity, summary))
    return found


def _device_rules(recipe: Recipe, plan: Plan) -> list[dict[str, Any]]:
    """The alerts on the devices of this Job's pods, from the exporter the hardware's vendor runs (none on CPU)."""
    exporter = devicetelemetry.exporter_for(recipe.hw.vendor)
    if exporter is None:
        return []
    return devicetelemetry.alert_rules(exporter, recipe.cluster.namespace, plan.job_name, metricnames.JOB_LABEL)


def prometheus_rule(recipe: Recipe, plan: Plan, ops: Operations) -> dict[str, Any]:
    """monitoring.coreos.com/v1 PrometheusRule: one group of this run's alerts (``spec`` is a Prometheus rules
    file, which ``promtool check rules`` reads)."""
    return {
        "apiVersion": MONITORING_API,
        "kind": "PrometheusRule",
        "metadata": {
            "name": plan.job_name,
            "namespace": recipe.cluster.namespace,
            "labels": {"app.kubernetes.io/name": plan.job_name, "app.kubernetes.io/managed-by": "recipekit"}
            | dict(recipe.ops.monitor_labels),
        },
        "spec": {"groups": [{"name": f"recipekit-{plan.job_name}", "rules": alert_rules(recipe, plan, ops)}]},
    }


def _panel(
    index: int, metric: metricnames.Metric, expr: str, title: str, legend: str = "rank {{rank}}"
) -> dict[str, Any]:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "description": metric.help,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "fieldConfig": {"defaults": {"unit": metric.unit or "none"}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [{"refId": "A", "expr": expr, "legendFormat": legend}],
    }


def dashboard_panels() -> list[tuple[metricnames.Metric, str, str]]:
    """(metric, PromQL with ``$job`` for the run, title) of each panel, in order."""
    job = f'{metricnames.JOB_LABEL}="$job"'
    panels = [
        (m, f"{m.name}{{{job}}}", m.help.rstrip("."))
        for m in metricnames.METRICS
        if m not in (metricnames.ALERTS, metricnames.LAST_STEP_TIME, metricnames.STEP)
    ]
    panels.insert(0, (metricnames.STEP, f"{metricnames.STEP.name}{{{job}}}", "Optimizer step"))
    panels.append(
        (
            metricnames.LAST_STEP_TIME,
            f"time() - {metricnames.LAST_STEP_TIME.name}{{{job}}}",
            "Seconds since the last step",
        )
    )
    panels.append((metricnames.ALERTS, f"increase({metricnames.ALERTS.name}{{{job}}}[1h])", "Alerts in the last hour"))
    return panels


def dashboard(recipe: Recipe, plan: Plan) -> dict[str, Any]:
    """A Grafana dashboard (schema 39) of every metric, per rank, for a chosen run (default: this one)."""
    panels = [_panel(i, metric, expr, title) for i, (metric, expr, title) in enumerate(dashboard_panels())]
    exporter = devicetelemetry.exporter_for(recipe.hw.vendor)
    if exporter is not None:  # the devices of the Job's pods, as the vendor's exporter serves them
        device = devicetelemetry.panels(exporter, recipe.cluster.namespace, "$job")
        panels += [_panel(len(panels) + i, *panel) for i, panel in enumerate(device)]
    return {
        "title": f"recipekit training: {recipe.name}",
        "uid": f"recipekit-{plan.run_id}",
        "tags": ["recipekit", "training"],
        "timezone": "browser",
        "schemaVersion": 39,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                {
                    "name": "job",
                    "type": "query",
                    "label": "Job",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": f"label_values({metricnames.STEP.name}, {metricnames.JOB_LABEL})",
                    "current": {"text": plan.job_name, "value": plan.job_name},
                    "refresh": 2,
                },
            ]
        },
        "panels": panels,
    }
