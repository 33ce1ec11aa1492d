"""The operations layer in `recipekit validate --dry-run`: two simulated pods on this CPU, gloo, the real Trainer.

* preflight passes on 2 pods, the cluster check report lists every check, the all-reduce test reports bandwidth;
  the metrics endpoint serves every metric name; the profiling window writes a trace;
* a pod that sees the wrong number of devices (``ops.testing.device_count``) or whose output directory cannot be
  written fails preflight with the reason, and no training starts;
* an injected NaN loss stops every rank with the message and ends the Job (TerminateJob) with the batch kept; under
  ``ops.nonfinite_loss: skip`` the Job restarts and resumes past the step's batch;
* an injected stall is detected by the hang watchdog, every rank's stacks are dumped, the job restarts and resumes,
  and the detection time and MTTR are reported.

What happened is read from the runtime's records in metrics.jsonl and the output directory, never from log text
(except where a run could write no record: an output directory that cannot be written). Slow: about a minute each.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from recipekit.bundle.build import build
from recipekit.cli import main
from recipekit.cli.validate import validate_command
from recipekit.runtime.boundary import filenames, metricslog
from recipekit.validate.dryrun.options import DryRunOptions
from recipekit.validate.dryrun.run import run_dry_run
from recipekit.validate.shared.loader import load_bundle
from recipekit.validate.shared.results import Status
from tests.integration.test_dryrun import _explain, processes_under

pytestmark = pytest.mark.slow

_MISSING = [m for m in ("torch", "transformers", "prometheus_client") if importlib.util.find_spec(m) is None]
if _MISSING:
    pytest.skip(f"the training stack is not installed ({', '.join(_MISSING)})", allow_module_level=True)

TIMEOUT_S = 420


def dry_run(tmp_path: Path, *overrides: str) -> dict:
    bundle = build(["recipe=tiny_sft", "parallel=ddp", *overrides], tmp_path / "bundle", force=True).path
    results = run_dry_run(load_bundle(bundle), DryRunOptions(pods=2, workdir=tmp_path / "work", timeout=TIMEOUT_S))
    assert processes_under(tmp_path / "work") == []
    return {r.id: r for r in results}


def output_dir(tmp_path: Path) -> Path:
    """The run's output directory: the work copy's recipe says where it is (runs/ also holds prepared/)."""
    recipe = yaml.safe_load((tmp_path / "work" / "bundle" / filenames.RECIPE_FILE).read_text(encoding="utf-8"))
    return Path(recipe["training_arguments"]["output_dir"])


def test_preflight_metrics_the_profiling_window_and_a_loss_spike(tmp_path: Path) -> None:
    """Rank 1's loss of step 5 is ten times (ops.testing.spike_at_step): the loss-spike alert fires there, and its
    report names rank 1 and each rank's batch by fingerprint."""
    spike = ["ops.testing.spike_rank=1", "ops.testing.spike_at_step=5"]
    results = dry_run(tmp_path, "train.profile_steps=[2,3]", *spike)
    assert all(r.status is not Status.FAIL for r in results.values()), _explain(results.values())
    pre = results["dryrun.preflight"]
    assert pre.status is Status.PASS and pre.details["ok"] is True
    assert [c["check"] for c in pre.details["checks"]] == list(filenames.PREFLIGHT_CHECKS)
    report = json.loads((output_dir(tmp_path) / filenames.CLUSTER_CHECK_FILE).read_text())
    assert report["pods"] == 2 and report["world_size"] == 2
    checks = {c["check"]: c for c in report["checks"]}
    assert checks["devices"]["status"] == "skip" and "cpu" in checks["devices"]["detail"]
    assert checks["versions"]["status"] == "pass" and checks["storage"]["status"] == "pass"
    bandwidth = checks["allreduce"]
    assert bandwidth["status"] in ("pass", "warn") and [r["size_mb"] for r in bandwidth["results"]] == [1.0, 4.0]
    assert all(r["algbw_gbps"] > 0 and r["busbw_gbps"] == r["algbw_gbps"] for r in bandwidth["results"])  # n = 2
    assert "busbw" in pre.reason
    metrics = results["dryrun.metrics"]
    assert metrics.status is Status.PASS and set(metrics.details["scraped"]["pods"]) == {0, 1}
    assert all("recipekit_loss" in pod["sampled"] for pod in metrics.details["scraped"]["pods"].values())
    profile = results["dryrun.profile"]
    assert profile.status is Status.PASS
    assert any(p.endswith("rank-0.pt.trace.json") for p in profile.details["traces"])
    assert results["dryrun.train"].details["final_step"] == 8

    records = metricslog.read_records(output_dir(tmp_path) / filenames.METRICS_FILE)
    (spiked,) = metricslog.events(records, metricslog.EVENT_LOSS_SPIKE)
    assert spiked["step"] == 5 and spiked["highest_rank"] == 1
    per_token = [loss / tokens for loss, tokens in zip(spiked["losses"], spiked["tokens"])]
    assert per_token[1] > 5 * per_token[0]  # ten times a loss per token of about rank 0's
    alerts = [r["alert"] for r in metricslog.events(records, metricslog.EVENT_ALERT) if r["step"] == 5]
    assert "loss_jump" in alerts
    where = Path(spiked["report"])
    report = json.loads((where / "report.json").read_text())
    assert report["steps"][-1]["step"] == 5 and report["steps"][-1]["highest_ranks"] == [1, 0]
    prints = [json.loads((where / f"batches-rank-{r}.json").read_text())["5"] for r in (0, 1)]
    assert all(p and all(len(b["sha256"]) == 64 and b["tokens"] > 0 for b in p) for p in prints)  # each micro-batch
    assert prints[0] != prints[1]  # each rank's own batches


def test_a_pod_with_the_wrong_device_count_fails_preflight_and_trains_nothing(tmp_path: Path) -> None:
    bundle = build(["recipe=tiny_sft", "parallel=ddp", "ops.testing.device_count=3"], tmp_path / "b", force=True).path
    result = CliRunner().invoke(
        validate_command,
        [str(bundle), "--dry-run", "--workdir", str(tmp_path / "work"), "--timeout", str(TIMEOUT_S), "--json"],
    )
    assert result.exit_code == 1, result.output
    checks = {c["id"]: c for c in json.loads(result.stdout)["checks"]}
    pre = checks["dryrun.preflight"]
    assert pre["status"] == "fail" and pre["details"]["training_started"] is False
    reasons = " ".join(f["message"] for f in pre["findings"])
    assert "sees 3 cpu device(s), the bundle starts 1 process(es) per pod" in reasons
    assert checks["dryrun.train"]["status"] == "fail" and checks["dryrun.metrics"]["status"] == "skipped"
    out = output_dir(tmp_path)
    assert not list(out.glob("checkpoint-*"))
    records = metricslog.read_records(out / filenames.METRICS_FILE)
    assert not metricslog.events(records, metricslog.EVENT_START) and not [r for r in records if "loss" in r]
    assert json.loads((out / filenames.CLUSTER_CHECK_FILE).read_text())["ok"] is False
    assert "train.py: preflight failed: devices:" in (tmp_path / "work" / "logs" / "pod-0.log").read_text()


def test_an_output_directory_that_cannot_be_written_fails_preflight(tmp_path: Path) -> None:
    """The data file sits where the runs' directory should be (a recipe mistake): no pod can create its run."""
    results = dry_run(tmp_path, "data.path=/mnt/shared/runs.jsonl", "cluster.output_dir=/mnt/shared/runs.jsonl")
    pre = results["dryrun.preflight"]
    assert pre.status is Status.FAIL and pre.details["training_started"] is False
    # Each pod fails on its own; the first to exit has Volcano end the other, perhaps before it printed its line.
    logs = " ".join(log.read_text() for log in (tmp_path / "work" / "logs").glob("pod-*.log"))
    assert re.search(r"train\.py: preflight failed: storage: pod \d: cannot write to", logs), pre.details["log_tails"]
    assert results["dryrun.train"].status is Status.FAIL


def test_an_injected_nan_ends_the_job_without_a_retry_and_keeps_the_batch(tmp_path: Path) -> None:
    results = dry_run(tmp_path, "ops.testing.nan_at_step=6")
    fault = results["dryrun.nonfinite"]
    assert fault.status is Status.PASS, _explain(results.values())
    record = fault.details["nonfinite"]
    assert record["step"] == 6 and record["ranks"] == [0, 1] and record["last_good_checkpoint"].endswith("checkpoint-4")
    assert "loss is not finite at step 6" in record["message"] and "the Job ends (TerminateJob" in record["message"]
    assert (fault.details["exit_code"], fault.details["action"], fault.details["attempts"]) == (5, "TerminateJob", 1)
    assert "the Job ends without a retry" in fault.reason
    report = json.loads((Path(record["report"]) / "report.json").read_text())
    assert report["step"] == 6 and report["last_good_checkpoint"].endswith("checkpoint-4")
    assert fault.details["batches_kept"] == ["batch-rank-0.json", "batch-rank-1.json"]
    assert results["dryrun.train"].status is Status.SKIP
    history = CliRunner().invoke(main, ["runs", "history", str(tmp_path / "work")])
    assert "1 start(s), 0 recovery(ies)" in history.output, history.output
    said = " ".join(history.output.split())  # runs history breaks its lines at the terminal's width
    assert "exit 5 nonfinite" in said and "the Job: TerminateJob (ops.nonfinite_loss: stop)" in said
    assert f"kept in {Path(record['report']).name}/" in said  # the report's directory


def test_an_injected_nan_under_skip_restarts_and_resumes_past_the_batch(tmp_path: Path) -> None:
    results = dry_run(tmp_path, "ops.testing.nan_at_step=6", "ops.nonfinite_loss=skip", "ops.testing.record_rows=true")
    fault = results["dryrun.nonfinite"]
    assert fault.status is Status.PASS, _explain(results.values())
    assert fault.details["action"] == "RestartJob" and fault.details["resumed_step"] == 4
    assert "the Job restarts (RestartJob)" in fault.details["nonfinite"]["message"]
    (skip,) = fault.details["skips"]
    assert skip["step"] == 6 and skip["stop"] > skip["start"] and fault.details["skipped_steps"] == [6]
    assert "the resume skipped step 6's batch" in fault.reason
    assert results["dryrun.train"].status is Status.PASS
    history = CliRunner().invoke(main, ["runs", "history", str(tmp_path / "work")])
    flat = " ".join(history.output.split())  # runs history breaks its lines at the terminal's width
    assert "the Job: RestartJob (ops.nonfinite_loss: skip), the resume skips step 6's batch" in flat
    # the row ledger, rank by rank: the restart replays step 5 as it was and never trains on step 6's rows again
    for path in sorted((output_dir(tmp_path) / "rows").glob("rank-*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        restart = next(i for i, line in enumerate(lines) if i and line["step"] < lines[i - 1]["step"])
        first, second = lines[:restart], lines[restart:]

        def step(lines: list[dict], n: int) -> list[list[int]]:
            return [line["rows"] for line in lines if line["step"] == n]

        bad = {(r, line["epoch"]) for line in first if line["step"] == 6 for r in line["rows"]}
        assert bad and second[0]["step"] == 5 and step(second, 5) == step(first, 5)
        assert not bad & {(r, line["epoch"]) for line in second for r in line["rows"]}, path.name


def test_an_injected_stall_is_detected_dumped_restarted_and_resumed(tmp_path: Path) -> None:
    bundle = build(
        ["recipe=tiny_sft", "parallel=ddp", "ops.testing.stall_at_step=6", "ops.testing.stall_rank=1"],
        tmp_path / "b",
        force=True,
    ).path
    result = CliRunner().invoke(
        validate_command,
        [str(bundle), "--dry-run", "--workdir", str(tmp_path / "work"), "--timeout", str(TIMEOUT_S), "--json"],
    )
    checks = {c["id"]: c for c in json.loads(result.stdout)["checks"]}
    assert result.exit_code == 0, json.dumps({k: v for k, v in checks.items() if k.startswith("dryrun")}, indent=1)
    stall = checks["dryrun.stall"]["details"]
    assert 1 in stall["stalled_ranks"] and stall["stall_timeout_s"] == 30
    assert 30 <= stall["detection_s"] < 60
    assert stall["stacks"] and all("stall-step-5-rank-" in Path(p).name for p in stall["stacks"])
    assert stall["last_step_before"] == 5
    assert stall["resumed_step"] == 4 and stall["first_step_after_restart"] == 5
    assert stall["mttr_s"] > stall["detection_s"]
    assert "MTTR" in checks["dryrun.stall"]["reason"] and "detected it after" in checks["dryrun.stall"]["reason"]
    assert checks["dryrun.train"]["details"]["final_step"] == 8
    subs = {s["field"] for s in checks["dryrun.prepare"]["details"]["substitutions"]}
    assert "recipe.ops.stall_timeout_floor_s" in subs
    assert processes_under(tmp_path / "work") == []
