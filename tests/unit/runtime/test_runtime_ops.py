"""The runtime's operations layer, piece by piece: preflight's verdicts, the watchdog, the alerts, fault markers,
the exporter. The dry runs (tests/integration/test_dryrun_ops.py) exercise them together over gloo."""

from __future__ import annotations

import os
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from recipekit.runtime.boundary import exitcodes, filenames, metricnames, metricslog
from recipekit.validate.dryrun.cluster.scrape import parse_exposition

torch = pytest.importorskip("torch")
preflight = pytest.importorskip("recipekit.runtime.ops.preflight")
from recipekit.runtime.boundary.recipeview import AlertsView, FaultsView, MetricsView  # noqa: E402
from recipekit.runtime.ops.faults import SPIKE_FACTOR, Faults  # noqa: E402
from recipekit.runtime.ops.watchdog import Watchdog  # noqa: E402
from recipekit.validate.shared.ports import free_port  # noqa: E402

NPU_SMI = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.0                   Version: 24.1.0                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 93.6        40                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3393 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | Alarm         | 90.1        41                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          3393 / 65536         |
+===========================+===============+====================================================+
"""


# ------------------------------------------------------------------------------------------------ preflight
def test_npu_smi_health_reads_each_npus_first_row() -> None:
    assert preflight.npu_smi_health(NPU_SMI) == [("0", "OK"), ("1", "Alarm")]


def _device(pod: int, kind: str = "npu", visible: int = 8, **extra) -> dict:
    return {"pod": pod, "kind": kind, "visible": visible, "simulated": False, **extra}


def test_device_verdicts() -> None:
    cpu = preflight.judge_devices([_device(0, "cpu", 0)], 1)
    assert cpu["status"] == "skip" and "no accelerator" in cpu["detail"]
    ok = preflight.judge_devices([_device(0, held_by_others_gib=0.2), _device(1)], 8)
    assert ok["status"] == "pass"
    wrong = preflight.judge_devices([_device(0), {**_device(1, "cpu", 3), "simulated": True}], 8)
    assert wrong["status"] == "fail" and "pod 1 (rank 1) sees 3 cpu device(s)" in wrong["detail"]
    assert "ops.testing.device_count" in wrong["detail"]
    held = preflight.judge_devices([_device(0, device=3, held_by_others_gib=20.5)], 8)
    assert held["status"] == "fail" and "npu:3 has 20.5 GiB in use by another process" in held["detail"]
    sick = preflight.judge_devices([_device(0, health={"npus": [("0", "OK"), ("1", "Alarm")]})], 8)
    assert sick["status"] == "fail" and "NPU 1 health Alarm" in sick["detail"]


def test_version_verdicts() -> None:
    same = [{"pod": i, "torch": "2.12.0+cpu", "torch_npu": "2.12.0", "cann": "9.1.0"} for i in range(2)]
    passed = preflight.judge_versions(same, {"torch": "2.12.0", "torch_npu": "2.12.0"})
    assert passed["status"] == "pass" and "torch 2.12.0+cpu" in passed["detail"]
    warned = preflight.judge_versions(same, {"torch": "2.12.0", "cann": "8.5.0"})
    assert warned["status"] == "warn" and "cann 9.1.0 (image pins 8.5.0)" in warned["detail"]
    skewed = [same[0], {**same[1], "cann": "8.5.0"}]
    failed = preflight.judge_versions(skewed, {})
    assert failed["status"] == "fail" and "cann: pod 0 9.1.0, pod 1 8.5.0" in failed["detail"]


def test_storage_verdicts(tmp_path: Path) -> None:
    writes = [{"pod": 0, "marker": "m0", "free_bytes": 10 * 2**30}, {"pod": 1, "marker": "m1", "free_bytes": 2**40}]
    assert preflight.judge_storage(writes, [[], []], tmp_path, 2**30)["status"] == "pass"
    unseen = preflight.judge_storage(writes, [[1], []], tmp_path, 2**30)
    assert unseen["status"] == "fail" and "ReadWriteMany" in unseen["detail"]
    full = preflight.judge_storage(writes, [[], []], tmp_path, 20 * 2**30)
    assert full["status"] == "fail" and "10.0 GiB free" in full["detail"] and "20.0 GiB" in full["detail"]
    broken = preflight.judge_storage(
        [{"pod": 0, "error": "cannot write to /x: Read-only file system"}], [], tmp_path, 1
    )
    assert broken["status"] == "fail" and "pod 0: cannot write to /x: Read-only" in broken["detail"]


def test_storage_write_reports_an_output_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "runs").write_text("not a directory")
    found = preflight.storage_write(tmp_path / "runs" / "job", 0, "t")
    assert "cannot write to" in found["error"]
    assert "is not a directory" in preflight.storage_write(tmp_path / "runs", 0, "t")["error"]
    good = preflight.storage_write(tmp_path / "out", 1, "tok")
    assert Path(good["marker"]).name == "pod-1.tok" and preflight.storage_read(tmp_path / "out", 2, "tok") == [0]


def test_bus_bandwidth_is_nccl_tests_definition() -> None:
    assert preflight.bus_bandwidth(10.0, 8) == pytest.approx(17.5)
    assert preflight.bus_bandwidth(10.0, 2) == pytest.approx(10.0)
    settings = {"bandwidth_warn_gbps": 98.0, "link": "HCCS", "link_gbps": 196.0}
    results = [
        {"size_mb": 1.0, "algbw_gbps": 5.0, "busbw_gbps": 8.75},
        {"size_mb": 256.0, "algbw_gbps": 40, "busbw_gbps": 70},
    ]
    warned = preflight.judge_bandwidth(results, 8, settings)
    assert warned["status"] == "warn" and "70.00 GB/s at 256 MB is below 98.00 GB/s (HCCS 196 GB/s" in warned["detail"]
    assert preflight.judge_bandwidth(results, 1, settings)["status"] == "skip"


#: The settings of the checks that find the slow part (recipe.yaml's operations.preflight), small for a test.
GATEABLE = {
    "mode": "warn",
    "p2p_size_mb": 0.1,
    "p2p_iterations": 1,
    "p2p_max_rounds": 4,
    "p2p_slow_fraction": 0.5,
    "storage_probe_mb": 1,
    "checkpoint_bytes": 1000,
    "checkpoint_save_limit_s": 600,
    "burn_in_s": 0,
    "burn_in_slow_fraction": 0.8,
    "burn_in_tflops": 0.0,
}


def test_preflight_runs_on_one_gloo_rank_and_writes_its_report(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    if torch.distributed.is_initialized():  # left by an earlier file's test on the same xdist worker
        torch.distributed.destroy_process_group()
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        settings = {
            "timeout_s": 60,
            "collective_hint": "hint",
            "devices_per_pod": 1,
            "expected_versions": {"torch": torch.__version__},
            "storage_needed_bytes": 1000,
            "allreduce_sizes_mb": [0.1],
            "allreduce_iterations": 2,
            "bandwidth_warn_gbps": 0.1,
            "link": "x",
            "link_gbps": 1,
            **GATEABLE,
        }
        out = tmp_path / "runs" / "job"
        report = preflight.run_preflight(
            settings,
            output_dir=out,
            device_kind="cpu",
            device_count=0,
            torch_device=torch.device("cpu"),
            simulated_devices=None,
            runtime_context_gib=0.0,
            metrics_file=out / filenames.METRICS_FILE,
        )
        assert report["ok"] and [c["check"] for c in report["checks"]] == list(filenames.PREFLIGHT_CHECKS)
        assert (out / filenames.CLUSTER_CHECK_FILE).is_file()
        (record,) = metricslog.events(metricslog.read_records(out / filenames.METRICS_FILE), metricslog.EVENT_PREFLIGHT)
        assert record["ok"] is True and len(record["checks"]) == len(filenames.PREFLIGHT_CHECKS)
        assert not list((out / filenames.PREFLIGHT_DIR).iterdir())  # the markers are removed
        with pytest.raises(preflight.PreflightFailed, match="preflight failed: devices: pod 0 .* sees 2 cpu"):
            preflight.run_preflight(
                settings,
                output_dir=out,
                device_kind="cpu",
                device_count=0,
                torch_device=torch.device("cpu"),
                simulated_devices=2,
                runtime_context_gib=0.0,
                metrics_file=out / filenames.METRICS_FILE,
            )
        assert preflight.PreflightFailed("x").code == exitcodes.EXIT_PREFLIGHT
    finally:
        torch.distributed.destroy_process_group()


# ------------------------------------------------------------------------------------------------- watchdog
def test_the_watchdog_dumps_stacks_records_and_exits(tmp_path: Path) -> None:
    codes: list[int] = []
    dog = Watchdog(output_dir=tmp_path, rank=3, metrics_file=tmp_path / "metrics.jsonl", exit=codes.append, poll_s=0.05)
    dog.arm("step 7", 0.2, 6)
    deadline = time.monotonic() + 10
    while not codes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert codes == [exitcodes.EXIT_STALLED]
    (record,) = metricslog.read_records(tmp_path / "metrics.jsonl")
    assert record["event"] == metricslog.EVENT_STALLED and record["rank"] == 3 and record["step"] == 6
    assert record["timeout_s"] == 0.2 and record["waited_s"] >= 0.2
    stacks = Path(record["stacks"]).read_text()
    assert Path(record["stacks"]).name == "stall-step-6-rank-3.txt"
    assert "no progress for" in stacks and "File " in stacks and "test_the_watchdog" in stacks


def test_a_rearmed_watchdog_does_not_fire(tmp_path: Path) -> None:
    codes: list[int] = []
    dog = Watchdog(output_dir=tmp_path, rank=0, metrics_file=None, exit=codes.append, poll_s=0.02)
    for step in range(10):
        dog.arm(f"step {step}", 0.3, step)
        time.sleep(0.05)
    dog.disarm()
    time.sleep(0.5)
    assert codes == []


# --------------------------------------------------------------------------------------------------- alerts
def test_alert_rules() -> None:
    from recipekit.runtime.ops.alerts import Alerts

    t = AlertsView(
        loss_spike_ratio=0.3,
        grad_norm_jump_ratio=0.3,
        mfu_target=0.4,
        mfu_low_steps=3,
        checkpoint_save_limit_s=600,
        device_utilisation_min=0.5,
        nonfinite_loss="stop",
    )
    alerts = Alerts(t)
    assert alerts.on_log(1, {"loss": 2.0, "grad_norm": 1.0, "mfu": 0.5}) == []
    raised = alerts.on_log(2, {"loss": 2.7, "grad_norm": 1.2, "mfu": 0.3})
    assert [a for a, _ in raised] == ["loss_jump"] and "35% in one logged step at step 2" in raised[0][1]
    assert alerts.figures["loss_jump_ratio"] == pytest.approx(0.35)
    assert [a for a, _ in alerts.on_log(3, {"loss": 2.7, "grad_norm": 2.0, "mfu": 0.3})] == ["grad_norm_jump"]
    low = alerts.on_log(4, {"loss": 2.6, "grad_norm": 2.0, "mfu": 0.3})
    assert [a for a, _ in low] == ["mfu_low"] and "for 3 logged steps, at step 4" in low[0][1]
    assert alerts.on_log(5, {"loss": 2.6, "grad_norm": 2.0, "mfu": 0.3}) == []  # once per episode
    assert alerts.on_log(6, {"loss": float("nan"), "grad_norm": 2.0}) == []  # the loss guard's job
    assert alerts.on_checkpoint(8, 601)[0][0] == "checkpoint_slow" and alerts.on_checkpoint(8, 10) == []
    assert [alerts.on_utilisation(i, 0.2) for i in range(3)][-1][0][0] == "device_utilisation_low"


# ---------------------------------------------------------------------------------------------------- faults
def test_a_fault_fires_once_per_output_directory(tmp_path: Path) -> None:
    testing = FaultsView(
        stall_rank=1,
        stall_at_step=5,
        nan_at_step=3,
        spike_rank=1,
        spike_at_step=4,
        device_count=None,
        device_count_pod=None,
        user_error_pod=None,
        record_rows=False,
    )
    rank0, rank1 = Faults(testing, tmp_path, 0), Faults(testing, tmp_path, 1)
    assert rank0.stall_at is None and rank1.stall_at == 5  # only the chosen rank stalls
    assert not rank0.poison_loss(2) and rank0.poison_loss(3) and rank1.poison_loss(3)
    assert (tmp_path / filenames.FAULTS_DIR / "nan-at-step-3").is_file()
    assert Faults(testing, tmp_path, 0).nan_at is None  # the restarted job runs clean
    (tmp_path / filenames.FAULTS_DIR / "stall-at-step-5").write_text("")
    assert Faults(testing, tmp_path, 1).stall_at is None
    # the spike: the chosen rank's every micro-batch of the step, ten times; then never again
    assert rank0.spike(4) == 1.0 and rank1.spike(3) == 1.0
    assert rank1.spike(4) == rank1.spike(4) == SPIKE_FACTOR == 10.0
    assert Faults(testing, tmp_path, 1).spike_at is None


# -------------------------------------------------------------------------------------------------- exporter
def test_the_exporter_serves_every_metric_name(monkeypatch) -> None:
    pytest.importorskip("prometheus_client")
    from recipekit.runtime.ops.exporter import NoExporter, start_exporter

    port = free_port()
    monkeypatch.setenv("RECIPEKIT_METRICS_PORT", str(port))
    exporter = start_exporter(MetricsView(ports=[9400], ranks="all", bind="0.0.0.0"), "job-abc", 0, 0)
    try:
        exporter.set(metricnames.LOSS, 1.5)
        exporter.alert("loss_jump")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        exporter.close()
    declared, sampled = parse_exposition(text)
    assert {m.name for m in metricnames.METRICS} <= declared
    assert 'recipekit_loss{rank="0",recipekit_job="job-abc"} 1.5' in text
    assert metricnames.ALERTS.name in sampled
    assert isinstance(start_exporter(MetricsView(ports=[9400], ranks="rank0", bind="0.0.0.0"), "j", 1, 0), NoExporter)
    assert isinstance(start_exporter(MetricsView(ports=[], ranks="all", bind="0.0.0.0"), "j", 0, 0), NoExporter)


def test_a_taken_port_means_no_metrics_not_a_failed_run(monkeypatch) -> None:
    pytest.importorskip("prometheus_client")
    from recipekit.runtime.ops.exporter import NoExporter, start_exporter

    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        monkeypatch.setenv("RECIPEKIT_METRICS_PORT", str(sock.getsockname()[1]))
        assert isinstance(start_exporter(MetricsView(ports=[9400], ranks="all", bind="0.0.0.0"), "j", 0, 0), NoExporter)


def test_records_from_several_writers_stay_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    pids = []
    for writer in range(4):
        pid = os.fork()
        if pid == 0:
            for i in range(200):
                metricslog.append_record(path, {"event": "x", "writer": writer, "i": i, "pad": "y" * 200})
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    records = metricslog.read_records(path)
    assert len(records) == 800 and len(path.read_text().splitlines()) == 800
