"""Device telemetry: the exporters' metrics on the dashboard and in the alerts, joined to the Job's pods; every new
alert proven with `promtool test rules` fixtures that fire and that stay quiet."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from recipekit.bundle import devicetelemetry as dt
from recipekit.runtime.boundary import metricnames as names
from tests.conftest import render_files

ASCEND = ["recipe=llama3_8b_sft", "hw=ascend910b"]
GPU = ["recipe=llama3_8b_sft", "hw=h100"]
_NAME = re.compile(r"\b(recipekit_[a-z_]+|npu_chip_info_[a-z_]+|DCGM_FI_[A-Z_]+)\b")


def _docs(overrides: list[str]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    files = render_files(overrides)
    rule = yaml.safe_load(files["prometheusrule.yaml"])
    board = json.loads(files["grafana-dashboard.json"])
    job = yaml.safe_load(files["volcano-job.yaml"])
    return rule, board, job


@pytest.mark.parametrize(("overrides", "exporter"), [(ASCEND, dt.NPU_EXPORTER), (GPU, dt.DCGM_EXPORTER)])
def test_every_panel_queries_a_served_metric_and_the_devices_are_charted(overrides, exporter) -> None:
    _, board, job = _docs(overrides)
    served = {m.name for m in names.METRICS} | dt.KNOWN_METRICS
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    queried = {n for e in exprs for n in _NAME.findall(e) if n != names.JOB_LABEL}
    assert queried <= served, queried - served
    assert {m.name for m in exporter.metrics} <= queried
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    places = [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in board["panels"]]
    assert len(places) == len(set(places))  # no two panels on one spot
    ns = job["metadata"]["namespace"]
    device = [e for e in exprs if exporter.metrics[0].name in e][0]
    assert f'namespace="{ns}",{exporter.pod_label}=~"$job-.+"' in device  # joined to the chosen run's pods


def test_a_cpu_run_charts_no_device() -> None:
    _, board, _ = _docs(["recipe=tiny_sft"])
    assert not any("npu_chip" in t["expr"] or "DCGM" in t["expr"] for p in board["panels"] for t in p["targets"])


# ------------------------------------------------------------------------------------------- promtool test rules
def _promtool_test(tmp_path: Path, rule: dict[str, Any], tests: list[dict[str, Any]]) -> subprocess.CompletedProcess:
    groups = rule["spec"]["groups"]
    for group in groups:
        for r in group["rules"]:
            r.pop("annotations", None)  # the fixtures prove when an alert fires; its wording is not under test
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    (tmp_path / "test.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests})
    )
    return subprocess.run(
        ["promtool", "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )


def _series(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _case(rule_labels: dict[str, str], alert: str, name: str, labels: dict[str, str], values: str, fires: bool):
    expected = [{"exp_labels": {**labels, **rule_labels}}] if fires else []
    return {
        "interval": "1m",
        "input_series": [{"series": _series(name, labels), "values": values}],
        "alert_rule_test": [{"eval_time": "15m", "alertname": alert, "exp_alerts": expected}],
    }


needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (prometheus)")


@needs_promtool
@pytest.mark.parametrize("overrides", [ASCEND, GPU], ids=["npu-exporter", "dcgm-exporter"])
def test_device_alerts_fire_on_the_jobs_devices_and_stay_quiet_otherwise(tmp_path: Path, overrides) -> None:
    rule, _, job = _docs(overrides)
    job_name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    task = job["spec"]["tasks"][0]["name"]
    npu = overrides is ASCEND
    exporter = dt.NPU_EXPORTER if npu else dt.DCGM_EXPORTER
    ours = {"namespace": ns, exporter.pod_label: f"{job_name}-{task}-1", exporter.device_label: "3"}
    theirs = {**ours, exporter.pod_label: f"another-job-{task}-0"}
    tags = {"severity": "critical", names.JOB_LABEL: job_name}
    warn = {**tags, "severity": "warning"}
    if npu:
        unhealthy = (dt.NPU_HEALTH.name, "1x5 0x15", "1x20")
        ecc = (dt.NPU_ECC_DOUBLE.name, "0x10 2x10", "5x20")  # a count that rises, and one that stays (at 5)
        link = (dt.NPU_LINK.name, "1x5 0x15", "1x20")
    else:
        unhealthy = (dt.GPU_XID.name, "0x10 79x10", "0x20")
        ecc = (dt.GPU_ECC_DOUBLE.name, "0x10 1x10", "4x20")
        link = (dt.GPU_NVLINK_RECOVERY.name, "0x10 1x10", "2x20")
    tests = []
    for alert, (name, bad, good), labels in (
        ("RecipekitDeviceUnhealthy", unhealthy, tags),
        ("RecipekitDeviceEccErrors", ecc, warn),
        ("RecipekitDeviceLinkDown", link, tags),
    ):
        tests.append(_case(labels, alert, name, ours, bad, fires=True))
        tests.append(_case(labels, alert, name, ours, good, fires=False))  # healthy readings
        tests.append(_case(labels, alert, name, theirs, bad, fires=False))  # another job's device
    proc = _promtool_test(tmp_path, rule, tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@needs_promtool
def test_the_grad_norm_alert_fires_either_way_past_30_percent(tmp_path: Path) -> None:
    rule, _, job = _docs(["recipe=tiny_sft"])
    job_name = job["metadata"]["name"]
    labels = {names.JOB_LABEL: job_name, "rank": "0"}
    tags = {"severity": "warning", names.JOB_LABEL: job_name}
    tests = [
        _case(tags, "RecipekitGradNormJump", names.GRAD_NORM_JUMP.name, labels, value, fires=fires)
        for value, fires in (("0.4x20", True), ("-0.4x20", True), ("0.2x20", False), ("-0.25x20", False))
    ]
    proc = _promtool_test(tmp_path, rule, tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
def test_the_mttr_alert_fires_on_a_slow_recovery_of_this_job_only(tmp_path: Path) -> None:
    rule, _, job = _docs(["recipe=tiny_sft", "ops.mttr_limit_s=600"])
    job_name = job["metadata"]["name"]
    ours = {names.JOB_LABEL: job_name, "rank": "0"}
    theirs = {**ours, names.JOB_LABEL: "another-job"}
    tags = {"severity": "warning", names.JOB_LABEL: job_name}
    tests = [
        _case(tags, "RecipekitRecoverySlow", names.RECOVERY_SECONDS.name, labels, values, fires=fires)
        for labels, values, fires in (
            (ours, "0x10 900x10", True),  # a recovery of 15 min against a limit of 10
            (ours, "0x10 450x10", False),  # a quick one
            (ours, "0x20", False),  # none yet
            (theirs, "0x10 900x10", False),  # another job's
        )
    ]
    proc = _promtool_test(tmp_path, rule, tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
def test_a_broken_fixture_fails_so_the_fixtures_can_fail(tmp_path: Path) -> None:
    rule, _, job = _docs(["recipe=tiny_sft"])
    labels = {names.JOB_LABEL: job["metadata"]["name"], "rank": "0"}
    tags = {"severity": "warning", names.JOB_LABEL: job["metadata"]["name"]}
    wrong = _case(tags, "RecipekitGradNormJump", names.GRAD_NORM_JUMP.name, labels, "0.1x20", fires=True)
    assert _promtool_test(tmp_path, rule, [wrong]).returncode != 0


def test_the_in_process_alert_warns_on_a_grad_norm_drop_too() -> None:
    from types import SimpleNamespace

    from recipekit.runtime.ops.alerts import Alerts

    thresholds = SimpleNamespace(loss_spike_ratio=0.3, grad_norm_jump_ratio=0.3, mfu_target=0.0, mfu_low_steps=5)
    alerts = Alerts(thresholds)
    assert alerts.on_log(1, {"grad_norm": 2.0}) == []
    raised = alerts.on_log(2, {"grad_norm": 1.0})  # halved
    assert [a for a, _ in raised] == ["grad_norm_jump"] and "fell 50%" in raised[0][1]
    assert alerts.on_log(3, {"grad_norm": 0.9}) == []  # -10%: within the limit
    assert "rose" in alerts.on_log(4, {"grad_norm": 2.0})[0][1]
    # the loss keeps its one-way rule: a falling loss is the point of training
    assert alerts.on_log(5, {"loss": 2.0}) == [] and alerts.on_log(6, {"loss": 1.0}) == []
