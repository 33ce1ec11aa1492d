"""Preflight finds the slow part: the pairwise point-to-point matrix names the slow node or link, the volume probe
times a checkpoint of the plan, burn-in judges each node, NVIDIA's error counters are read defensively, and
``ops.preflight: strict`` turns a warning into its own exit code. The dry run (tests/integration/
test_dryrun_preflight_gate.py) runs all of it over gloo with one node slowed on purpose."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipekit.runtime.boundary import exitcodes, filenames, metricslog

torch = pytest.importorskip("torch")
preflight = pytest.importorskip("recipekit.runtime.ops.preflight")
from recipekit.runtime.ops.preflight import burnin, p2p, volumeprobe  # noqa: E402
from recipekit.validate.shared.ports import free_port  # noqa: E402

PODS_2x2 = [0, 0, 1, 1]
HOSTS_2x2 = ["node-a", "node-a", "node-b", "node-b"]


# ------------------------------------------------------------------------------------------------------ p2p
def test_the_rounds_pair_every_rank_once_and_cross_nodes_first() -> None:
    assert p2p.rounds(4, 2, 16) == [2, 3, 1]  # 2 and 3 pair ranks of different nodes
    assert p2p.rounds(1, 1, 16) == []
    for k in p2p.rounds(6, 2, 16):  # a perfect matching (some ranks idle where their partner is beyond the world)
        partners = [r ^ k for r in range(6) if (r ^ k) < 6]
        assert len(set(partners)) == len(partners)
    assert len(p2p.rounds(1000, 8, 16)) == 16 and all(k >= 8 for k in p2p.rounds(1000, 8, 16))


def _times(slow_rank: int | None, world: int = 4, fast: float = 0.01, slow: float = 0.5) -> list[dict[str, float]]:
    """Each rank's time per round as measure() gathers them: the slow rank's pairs take ``slow`` at both ends."""
    times: list[dict[str, float]] = [{} for _ in range(world)]
    for k in p2p.rounds(world, 2, 16):
        for r in range(world):
            peer = r ^ k
            if peer < world:
                times[r][str(k)] = slow if slow_rank in (r, peer) else fast
    return times


def test_a_slow_rank_names_its_node_by_pod_and_host() -> None:
    found = preflight.judge_p2p(_times(slow_rank=3), PODS_2x2, HOSTS_2x2, _settings(), "cpu")
    assert found["status"] == "warn" and found["slow_pods"] == [1]
    assert "slow node: pod 1 (node-b), rank(s) 3" in found["detail"] and "slow link" not in found["detail"]
    assert len(found["matrix"]) == 6  # every pair of 4 ranks, each measured once


def test_a_slow_pair_between_healthy_ranks_names_the_link() -> None:
    times = _times(slow_rank=None, world=8)
    times[1]["4"] = times[5]["4"] = 0.5  # rank 1 ↔ rank 5 only
    pods = [0, 0, 1, 1, 2, 2, 3, 3]
    found = preflight.judge_p2p(times, pods, [f"n{p}" for p in pods], _settings(), "cpu")
    assert found["status"] == "warn" and found["slow_pods"] == []
    assert "slow link: rank 1 (pod 0, n0) ↔ rank 5 (pod 2, n2)" in found["detail"]


def test_healthy_pairs_pass_and_a_device_pair_below_the_link_rating_is_slow() -> None:
    assert preflight.judge_p2p(_times(None), PODS_2x2, HOSTS_2x2, _settings(), "cpu")["status"] == "pass"
    # 2 nodes: every cross pair touches both, so only the link's rating can tell (bandwidth_warn_gbps on a device)
    slow_everywhere = preflight.judge_p2p(_times(None, fast=1.0), PODS_2x2, HOSTS_2x2, _settings(), "npu")
    assert slow_everywhere["status"] == "warn" and "slow link" in slow_everywhere["detail"]


def test_the_slow_hook_is_for_one_rank_and_refuses_junk() -> None:
    env = {exitcodes.SLOW_RANK_ENV: "3:0.25"}
    assert p2p.slow_delay(3, env) == 0.25 and p2p.slow_delay(2, env) == 0.0
    for junk in ("3", "x:1", "3:nan", "3:-1", "3:1e9", ""):
        assert p2p.slow_delay(3, {exitcodes.SLOW_RANK_ENV: junk}) == 0.0


# ---------------------------------------------------------------------------------------------- the volume
def test_the_volume_probe_writes_reads_and_removes_its_file(tmp_path: Path) -> None:
    written = volumeprobe.write_probe(tmp_path, 0, 2)
    assert written["bytes"] == 2 * 1024 * 1024 and written["write_s"] > 0
    assert volumeprobe.read_probe(written)["read_s"] > 0
    assert list(tmp_path.iterdir()) == []


def test_the_checkpoint_time_follows_from_the_volume_and_a_slow_pod_is_named() -> None:
    probes = [{"pod": p, "bytes": 100_000_000, "write_s": 1.0, "read_s": 0.5} for p in range(3)]
    fine = volumeprobe.judge(probes, 300_000_000, 600, 0.5)
    assert fine["problems"] == [] and fine["write_mbps"] == 300.0 and fine["checkpoint_s"] == 1.0
    slow = volumeprobe.judge(probes, 10**12, 600, 0.5)  # 1 TB at 300 MB/s: 3333 s
    assert "takes about 3333 s at 300 MB/s, above ops.checkpoint_save_limit_s (600 s)" in slow["problems"][0]
    probes[2]["write_s"] = 10.0
    assert any("pod 2 writes at 10 MB/s" in p for p in volumeprobe.judge(probes, 1, 600, 0.5)["problems"])
    broken = volumeprobe.judge([{"pod": 0, "error": "cannot write x: Read-only file system"}], 1, 600, 0.5)
    assert broken["problems"] == ["pod 0: cannot write x: Read-only file system"]


# -------------------------------------------------------------------------------------------------- burn-in
def test_burn_in_names_the_node_below_the_others_and_below_the_plans_rate() -> None:
    results = [{"tflops": t, "allreduce_ms": 3.0, "finite": True} for t in (10.0, 10.0, 10.0, 4.0)]
    verdicts, _ = burnin.judge(results, PODS_2x2, HOSTS_2x2, 0.8, None)
    assert [v["verdict"] for v in verdicts] == ["pass", "slow"]  # a node's rate is its slowest rank's
    three = [0, 1, 2, 2]
    verdicts, problems = burnin.judge(results, three, ["a", "b", "c", "c"], 0.8, None)
    assert [v["verdict"] for v in verdicts] == ["pass", "pass", "slow"]
    assert problems == ["burn-in: pod 2 (c): 4 TFLOP/s, the median node 10"]
    _, below = burnin.judge(results, three, ["a", "b", "c", "c"], 0.8, 12.0)
    assert len(below) == 3 and "below the 12 the plan assumes" in below[0]


# ------------------------------------------------------------------------------------------------- devices
def test_nvidia_counters_are_read_defensively() -> None:
    text = "0, 0, No, No\n1, 3, Yes, [N/A]\n2, [Not Supported], [N/A], [N/A]\ngarbage\n3, 99999999999999, No, No\n"
    assert preflight.nvidia_counters(text) == [
        ("1", "ecc.errors.uncorrected.volatile.total", 3),
        ("1", "retired_pages.pending", 1),
    ]
    found = preflight.judge_devices(
        [{"pod": 0, "kind": "cuda", "visible": 8, "simulated": False, "health": {"counters": [["1", "x", 3]]}}], 8
    )
    assert found["status"] == "warn" and "pod 0 GPU 1: x 3" in found["detail"]


# ----------------------------------------------------------------------------------------- strict and warn
def _settings(**changed) -> dict:
    settings = {
        "mode": "warn",
        "timeout_s": 60,
        "collective_hint": "hint",
        "devices_per_pod": 1,
        "expected_versions": {"torch": torch.__version__},
        "storage_needed_bytes": 1000,
        "allreduce_sizes_mb": [0.1],
        "allreduce_iterations": 1,
        "bandwidth_warn_gbps": 2.0,
        "link": "x",
        "link_gbps": 4,
        "p2p_size_mb": 1.0,
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
    return {**settings, **changed}


def _run(out: Path, settings: dict) -> dict:
    return preflight.run_preflight(
        settings,
        output_dir=out,
        device_kind="cpu",
        device_count=0,
        torch_device=torch.device("cpu"),
        simulated_devices=None,
        runtime_context_gib=0.0,
        metrics_file=out / filenames.METRICS_FILE,
    )


def test_strict_ends_the_job_on_a_warning_that_warn_lets_pass(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        huge = {"checkpoint_bytes": 10**15, "checkpoint_save_limit_s": 1, "burn_in_s": 1}
        warned = _run(tmp_path / "warn", _settings(**huge))
        by_name = {c["check"]: c for c in warned["checks"]}
        assert warned["ok"] and by_name["throughput"]["status"] == "warn" and not warned["gated"]
        assert by_name["burnin"]["status"] == "pass" and by_name["burnin"]["nodes"][0]["verdict"] == "pass"
        with pytest.raises(preflight.PreflightGate, match=r"ops.preflight: strict.*throughput: a checkpoint") as gate:
            _run(tmp_path / "strict", _settings(mode="strict", **huge))
        assert gate.value.code == exitcodes.EXIT_PREFLIGHT_GATE
        records = metricslog.read_records(tmp_path / "strict" / filenames.METRICS_FILE)
        (record,) = metricslog.events(records, metricslog.EVENT_PREFLIGHT)
        assert record["ok"] is False and record["gated"] is True and record["mode"] == "strict"
        assert not list((tmp_path / "strict" / filenames.PREFLIGHT_DIR).iterdir())  # the probe file is gone
    finally:
        torch.distributed.destroy_process_group()


def test_the_gate_has_its_own_code_and_ends_the_job() -> None:
    (entry,) = [c for c in exitcodes.EXIT_CODES if c.name == "preflight_gate"]
    assert entry.action == "TerminateJob" and entry.code == exitcodes.EXIT_PREFLIGHT_GATE
    assert {"exitCode": entry.code, "action": "TerminateJob"} in exitcodes.exit_code_policies()
