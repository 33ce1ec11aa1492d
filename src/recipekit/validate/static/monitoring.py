"""Static checks of the operations layer: the monitoring files against the Job and the runtime's metric names, the
alert rules through promtool, and the collective timeouts against recipe.yaml's watchdog numbers.

* ``monitoring``: a bundle that serves metrics (recipe.yaml ``operations.metrics.ports``) carries the PodMonitor,
  the PrometheusRule and the dashboard; the PodMonitor selects the Job's pods in the Job's namespace and scrapes
  ports the trainer container declares; every metric an alert or a panel queries is one the exporter serves
  (``recipekit.runtime.boundary.metricnames``), scoped to this Job; ``promtool check rules`` (Debian's ``prometheus``
  package) accepts the rules and, as recording rules, every panel's query — skipped with the reason without promtool.
* ``operations``: launch.json's collective timeouts are the ones recipe.yaml's watchdog section was computed with
  (one source: recipekit.memory.operations), and the Trainer's process-group timeout is the startup one.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from recipekit.bundle import devicetelemetry
from recipekit.bundle.files import DASHBOARD, LAUNCH, PODMONITOR, PROMETHEUS_RULE, RECIPE
from recipekit.runtime.boundary import metricnames
from recipekit.validate.shared.loader import Bundle
from recipekit.validate.shared.results import Result

_METRIC = re.compile(r"\b(recipekit_[a-z_]+|npu_chip_info_[a-z_]+|DCGM_FI_[A-Z_]+)\b")


def _operations(bundle: Bundle) -> dict[str, Any]:
    ops = (bundle.doc or {}).get("operations")
    return ops if isinstance(ops, dict) else {}


def _load(bundle: Bundle, name: str) -> Any:
    text = bundle.text(name)
    if text is None:
        return None
    try:
        return json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError):
        return None


def _served() -> set[str]:
    served = {m.name for m in metricnames.METRICS}
    return served | {name.removesuffix("_total") for name in served} | set(devicetelemetry.KNOWN_METRICS)


def _queried(expr: str) -> set[str]:
    return {name for name in _METRIC.findall(expr) if name != metricnames.JOB_LABEL}


def check_monitoring(bundle: Bundle) -> Result:
    result = Result("ops.monitoring", "PodMonitor, PrometheusRule and dashboard match the Job and the metric names")
    ports = ((_operations(bundle).get("metrics") or {}).get("ports")) or []
    files = (PODMONITOR, PROMETHEUS_RULE, DASHBOARD)
    if not ports:
        present = [name for name in files if name in bundle.raw]
        if present:
            result.fail(RECIPE, "operations.metrics", f"no metrics served, yet the bundle has {', '.join(present)}")
        return result if result.failed else result.skip("the recipe serves no metrics (ops.metrics_port: null)")
    docs = {name: _load(bundle, name) for name in files}
    for name, doc in docs.items():
        if not isinstance(doc, dict):
            result.fail(name, "", "missing or unparseable" if name not in bundle.raw else "does not parse")
    if result.failed or bundle.job is None:
        return result if result.failed else result.skip("needs a parseable volcano-job.yaml (see files.parse)")
    job = bundle.job
    job_name = str(job.get("metadata", {}).get("name"))
    template = job["spec"]["tasks"][0]["template"]
    container = template["spec"]["containers"][0]
    declared_ports = {p.get("name") for p in container.get("ports", [])}
    pod_labels = template.get("metadata", {}).get("labels", {})

    monitor = docs[PODMONITOR]
    selector = monitor.get("spec", {}).get("selector", {}).get("matchLabels", {})
    if not selector or any(pod_labels.get(k) != v for k, v in selector.items()):
        result.fail(
            PODMONITOR, "spec.selector.matchLabels", f"{selector} does not select the Job's pods ({pod_labels})"
        )
    namespace = job.get("metadata", {}).get("namespace")
    if monitor.get("metadata", {}).get("namespace") != namespace:
        result.fail(PODMONITOR, "metadata.namespace", f"not the Job's namespace {namespace!r}")
    scraped = [e.get("port") for e in monitor.get("spec", {}).get("podMetricsEndpoints", [])]
    undeclared = [p for p in scraped if p not in declared_ports]
    if undeclared or len(scraped) != len(ports):
        result.fail(
            PODMONITOR,
            "spec.podMetricsEndpoints",
            f"scrapes {scraped}; the trainer container declares {sorted(p for p in declared_ports if p)} and "
            f"recipe.yaml serves {len(ports)} port(s)",
        )

    served, scope = _served(), f'{metricnames.JOB_LABEL}="{job_name}"'
    rules = [r for g in docs[PROMETHEUS_RULE].get("spec", {}).get("groups", []) for r in g.get("rules", [])]
    if not rules:
        result.fail(PROMETHEUS_RULE, "spec.groups", "no rules")
    for rule in rules:
        expr = str(rule.get("expr", ""))
        unknown = _queried(expr) - served
        if unknown:
            result.fail(PROMETHEUS_RULE, str(rule.get("alert")), f"queries {sorted(unknown)}, which nothing serves")
        if scope not in expr and f'=~"{job_name}-' not in expr:  # device alerts select the Job's pods
            result.fail(PROMETHEUS_RULE, str(rule.get("alert")), f"not scoped to this Job ({scope})")
    panels = docs[DASHBOARD].get("panels", [])
    exprs = [t.get("expr", "") for p in panels for t in p.get("targets", [])]
    for expr in exprs:
        unknown = _queried(expr) - served
        if unknown:
            result.fail(DASHBOARD, "panels", f"{expr!r} queries {sorted(unknown)}, which nothing serves")
    charted = {name for expr in exprs for name in _queried(expr)}
    uncharted = sorted({m.name for m in metricnames.METRICS} - charted)
    if uncharted:
        result.fail(DASHBOARD, "panels", f"no panel for {', '.join(uncharted)}")
    if result.failed:
        return result
    checked = promtool(docs[PROMETHEUS_RULE], [e.replace("$job", job_name) for e in exprs])
    result.details["promtool"] = checked
    if checked.get("error"):
        result.fail(PROMETHEUS_RULE, "promtool", checked["error"])
        return result
    how = "promtool check rules passed" if checked.get("ok") else f"promtool skipped ({checked.get('skipped')})"
    result.reason = (
        f"{len(scraped)} port(s) scraped, {len(rules)} alerts, {len(panels)} panels, all on served metrics; {how}"
    )
    return result


def promtool(rule: dict[str, Any], panel_exprs: list[str]) -> dict[str, Any]:
    """``promtool check rules`` on the PrometheusRule's groups plus every panel query as a recording rule."""
    tool = shutil.which("promtool")
    if tool is None:
        return {"skipped": "promtool not found: apt-get install prometheus"}
    groups = list(rule.get("spec", {}).get("groups", []))
    groups.append(
        {
            "name": "dashboard-queries",
            "rules": [{"record": f"recipekit:panel_{i}", "expr": e} for i, e in enumerate(panel_exprs)],
        }
    )
    with tempfile.TemporaryDirectory(prefix="recipekit-promtool-") as tmp:
        path = Path(tmp) / "rules.yaml"
        path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False), encoding="utf-8")
        try:
            proc = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return {"skipped": f"promtool did not run: {exc}"}
    output = " ".join((proc.stdout + proc.stderr).split())
    if proc.returncode != 0:
        return {"error": f"promtool check rules failed: {output[:400]}"}
    return {"ok": True, "output": output[:200]}


def check_operations(bundle: Bundle) -> Result:
    result = Result("ops.timeouts", "collective timeouts in launch.json are recipe.yaml's watchdog numbers")
    ops = _operations(bundle)
    watchdog = ops.get("watchdog") or {}
    if not watchdog or bundle.launch is None:
        return result.skip("needs recipe.yaml's operations section and a parseable launch.json")
    env = bundle.launch.get("env") or {}
    backend = bundle.plan.get("comm_backend")
    steady, startup = watchdog.get("steady_timeout_s"), watchdog.get("startup_timeout_s")
    if backend == "hccl":
        if env.get("HCCL_EXEC_TIMEOUT") != str(steady):
            result.fail(
                LAUNCH, "env.HCCL_EXEC_TIMEOUT", f"{env.get('HCCL_EXEC_TIMEOUT')}, the steady timeout is {steady}"
            )
        if env.get("HCCL_CONNECT_TIMEOUT") != str(startup):
            result.fail(
                LAUNCH,
                "env.HCCL_CONNECT_TIMEOUT",
                f"{env.get('HCCL_CONNECT_TIMEOUT')}, the startup timeout is {startup}",
            )
    if backend == "nccl" and env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") not in ("1", "3"):
        result.fail(LAUNCH, "env.TORCH_NCCL_ASYNC_ERROR_HANDLING", "unset: a timed-out NCCL collective would hang")
    megatron = (bundle.doc or {}).get("megatron")
    if isinstance(megatron, dict):  # the Megatron room's process group timeout, in whole minutes
        minutes = (megatron.get("dist") or {}).get("distributed_timeout_minutes")
        if not isinstance(minutes, int) or not isinstance(startup, (int, float)) or minutes * 60 < startup:
            result.fail(
                RECIPE, "megatron.dist.distributed_timeout_minutes", f"{minutes}, the startup timeout is {startup} s"
            )
    elif bundle.args.get("ddp_timeout") != startup:
        ddp = bundle.args.get("ddp_timeout")
        result.fail(RECIPE, "training_arguments.ddp_timeout", f"{ddp}, the startup timeout is {startup}")
    if not result.failed:
        result.reason = (
            f"startup {startup} s, step stall {watchdog.get('stall_timeout_s')} s, steady {steady} s ({backend})"
        )
    return result
