"""The run's own alerts at the seeds' thresholds, each proven with `promtool test rules` on series shaped as the
runtime's exporter serves them: the series' names and labels come from scraping a real Exporter (the one every
training process starts, runtime/ops/exporter.py) fed by the runtime's own code, plus the ``pod`` label the Prometheus
Operator's PodMonitor adds to every target. Each alert has a case that fires and one that stays quiet.

The thresholds (recipe keys under ``ops``, the seeds' defaults): device utilisation below 50% sustained, a
gradient-norm change above 30%, a checkpoint taking more than 10 minutes, a recovery (MTTR) above 5 minutes, and the
log keywords (HCCL/NCCL timeout, ECC/Xid, device OOM) for 15 minutes after a rank's log named one.
"""

from __future__ import annotations

import re
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from recipekit.runtime.boundary import metricnames as names
from tests.conftest import render_files
from tests.unit.bundle.test_device_telemetry import _promtool_test

pytest.importorskip("prometheus_client")
from recipekit.runtime.ops.exporter import Exporter  # noqa: E402
from recipekit.runtime.ops.logevents import LogEvents  # noqa: E402
from recipekit.validate.shared.ports import free_port

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (prometheus)")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@pytest.fixture(scope="module")
def rules() -> dict[str, Any]:
    return yaml.safe_load(render_files(["recipe=tiny_sft"])["prometheusrule.yaml"])


def _job(rules: dict[str, Any]) -> str:
    return rules["metadata"]["name"]


@pytest.fixture(scope="module")
def served(rules, tmp_path_factory) -> dict[str, dict[str, str]]:
    """Every series a rank-1 exporter serves once the runtime fed it: name (with the kind) → labels, plus ``pod``."""
    port = free_port()
    exporter = Exporter(port, _job(rules), 1, "127.0.0.1")
    try:
        for metric in names.METRICS:
            if metric.kind == "gauge" and not metric.label:
                exporter.set(metric, 0.0)
        events = LogEvents(tmp_path_factory.mktemp("run"), 1, exporter)
        events.note("RuntimeError: HCCL function error: EI0002 the wait execution of the Notify register times out")
        events.note("torch.OutOfMemoryError: NPU out of memory. Tried to allocate 2.00 GiB")
        events.note("RuntimeError: CUDA error: uncorrectable ECC error encountered")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        exporter.close()
    found = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and not line.startswith("#"):
            labels = dict(_LABEL.findall(match.group(2) or ""))
            key = match.group(1) + (f"/{labels[names.KIND_LABEL]}" if names.KIND_LABEL in labels else "")
            found[key] = {**labels, "pod": f"{_job(rules)}-worker-1"}
    return found


def _rule(rules: dict[str, Any], alert: str) -> dict[str, Any]:
    return next(r for g in rules["spec"]["groups"] for r in g["rules"] if r["alert"] == alert)


def _case(rule: dict[str, Any], name: str, labels: dict[str, str], values: str, at: str, fires: bool) -> dict:
    series = name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    expected = [{"exp_labels": {**labels, **rule["labels"]}}] if fires else []
    return {
        "interval": "1m",
        "input_series": [{"series": series, "values": values}],
        "alert_rule_test": [{"eval_time": at, "alertname": rule["alert"], "exp_alerts": expected}],
    }


def _minutes(duration: str) -> int:
    number, unit = int(duration[:-1]), duration[-1]
    return number if unit == "m" else number * 60 if unit == "h" else max(1, number // 60)


#: (alert, series key, values that fire, values that stay quiet): the seeds' thresholds at their defaults.
GAUGE_CASES = [
    ("RecipekitGradNormJump", names.GRAD_NORM_JUMP.name, "0.1 0.05 -0.35", "0.1 0.29 -0.29"),
    ("RecipekitCheckpointSlow", names.CHECKPOINT_SECONDS.name, "120 601", "120 599"),
    ("RecipekitRecoverySlow", names.RECOVERY_SECONDS.name, "0 301", "0 299"),
]


@needs_promtool
@pytest.mark.parametrize(("alert", "key", "fire", "quiet"), GAUGE_CASES)
def test_a_gauge_alert_fires_above_its_threshold_only(rules, served, tmp_path: Path, alert, key, fire, quiet) -> None:
    rule = _rule(rules, alert)
    steps = len(fire.split()) - 1
    cases = [_case(rule, key, served[key], fire, f"{steps}m", True)]
    cases.append(_case(rule, key, served[key], quiet, f"{steps}m", False))
    proc = _promtool_test(tmp_path, rules, cases)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_thresholds_are_the_seeds(rules) -> None:
    exprs = {r["alert"]: r["expr"] for g in rules["spec"]["groups"] for r in g["rules"]}
    assert exprs["RecipekitGradNormJump"].endswith("> 0.3")
    assert exprs["RecipekitCheckpointSlow"].endswith("> 600")
    assert exprs["RecipekitRecoverySlow"].endswith("> 300")
    assert exprs["RecipekitDeviceUtilisationLow"].endswith("< 0.5")
    assert all(exprs[a].endswith("< 900") for a in ("RecipekitCollectiveTimeout", "RecipekitDeviceOutOfMemory"))


@needs_promtool
def test_low_device_utilisation_fires_only_when_sustained(rules, tmp_path: Path) -> None:
    rule = _rule(rules, "RecipekitDeviceUtilisationLow")
    hold = _minutes(rule["for"])
    # a CPU run serves no utilisation (names.DEVICE_ONLY): its labels are every gauge's, as a device's exporter serves
    labels = {names.JOB_LABEL: _job(rules), names.RANK_LABEL: "1", "pod": f"{_job(rules)}-worker-1"}
    name = names.DEVICE_UTILISATION.name
    low, dip = f"0.3x{hold + 2}", f"0.9x{hold} 0.3 0.9x2"
    cases = [_case(rule, name, labels, low, f"{hold + 2}m", True)]
    cases.append(_case(rule, name, labels, dip, f"{hold + 2}m", False))  # one low sample is no sustained low
    proc = _promtool_test(tmp_path, rules, cases)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
@pytest.mark.parametrize(
    ("alert", "kind"),
    [
        ("RecipekitCollectiveTimeout", "collective_timeout"),
        ("RecipekitDeviceEccError", "device_ecc"),
        ("RecipekitDeviceOutOfMemory", "device_oom"),
    ],
)
def test_a_log_keyword_alerts_with_pod_and_rank_for_its_window(rules, served, tmp_path: Path, alert, kind) -> None:
    rule = _rule(rules, alert)
    key = f"{names.LOG_EVENT_TIME.name}/{kind}"
    labels = served[key]
    assert labels[names.RANK_LABEL] == "1" and labels[names.KIND_LABEL] == kind  # what the exporter served
    # the event's Unix time on promtool's clock (it starts at 0): logged at 5 min, served from then on
    values = "_x5 300x30"
    fires = _case(rule, names.LOG_EVENT_TIME.name, labels, values, "10m", True)
    quiet_after = _case(rule, names.LOG_EVENT_TIME.name, labels, values, "25m", False)
    quiet_before = _case(rule, names.LOG_EVENT_TIME.name, labels, values, "3m", False)
    proc = _promtool_test(tmp_path, rules, [fires, quiet_after, quiet_before])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_exporter_served_every_kind_with_its_count(served) -> None:
    for kind in names.LOG_EVENT_KINDS:
        assert f"{names.LOG_EVENTS.name}/{kind}" in served and f"{names.LOG_EVENT_TIME.name}/{kind}" in served


@needs_promtool
def test_a_failed_cold_copy_alerts_for_the_hour_after(tmp_path: Path) -> None:
    """train.cold_checkpoints: the in-process alert's counter, as a real exporter serves it, fires the rule once a
    copy failed, for an hour; without a cold tier there is no rule."""
    assert b"RecipekitColdCopyFailed" not in render_files(["recipe=tiny_sft"])["prometheusrule.yaml"]
    cold = 'train.cold_checkpoints.command=[aws,s3,sync,"{checkpoint}","s3://b/{run}/{name}"]'
    rules = yaml.safe_load(render_files(["recipe=tiny_sft", cold])["prometheusrule.yaml"])
    rule = _rule(rules, "RecipekitColdCopyFailed")
    port = free_port()
    exporter = Exporter(port, _job(rules), 0, "127.0.0.1")
    try:
        exporter.alert(names.COLD_COPY_FAILED)  # what health.checkpoint_cold raises for a failed copy
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        exporter.close()
    (line,) = [x for x in text.splitlines() if x.startswith(names.ALERTS.name + "{")]
    labels = {**dict(_LABEL.findall(_SAMPLE.match(line).group(2))), "pod": f"{_job(rules)}-worker-0"}
    assert labels[names.ALERT_LABEL] == names.COLD_COPY_FAILED
    name = names.ALERTS.name
    cases = [
        _case(rule, name, labels, "0x5 1x10", "10m", True),  # failed at 5 min: fires after
        _case(rule, name, labels, "0x5 1x90", "80m", False),  # over an hour later: quiet
        _case(rule, name, labels, "0x15", "10m", False),  # never failed
    ]
    proc = _promtool_test(tmp_path, rules, cases)
    assert proc.returncode == 0, proc.stdout + proc.stderr
