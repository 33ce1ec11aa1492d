"""The operations layer at build time: the ``ops`` recipe section, the numbers recipekit.memory.operations derives, the
files they are rendered into (recipe.yaml, launch.json, the Job, the monitoring files) and the static checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from recipekit.base.errors import RecipeError
from recipekit.bundle.build import build, resolve
from recipekit.bundle.monitoring import dashboard_panels
from recipekit.cli import main as cli_main
from recipekit.memory import estimate
from recipekit.memory.operations import operations
from recipekit.runtime.boundary import metricnames
from recipekit.validate.shared.loader import load_bundle, rehash_manifest
from recipekit.validate.shared.results import Status
from recipekit.validate.static.monitoring import check_monitoring, check_operations, promtool
from tests.conftest import render_files


def problems_of(*overrides: str) -> dict[str, str]:
    with pytest.raises(RecipeError) as info:
        resolve(list(overrides))
    return {p.key: f"{p.message} ({p.hint})" for p in info.value.problems}


def ops_of(*overrides: str):
    resolved = resolve(list(overrides))
    return operations(resolved.recipe, resolved.plan, estimate(resolved.recipe, resolved.plan)), resolved


def files_of(*overrides: str) -> dict[str, bytes]:
    return render_files(list(overrides))


# ------------------------------------------------------------------------------------------------- the recipe
def test_every_threshold_has_its_default_in_the_record() -> None:
    ops = resolve(["recipe=tiny_sft"]).recipe.ops
    assert ops.preflight and ops.preflight_timeout_s == 120 and ops.bandwidth_warn_fraction == 0.5
    assert ops.allreduce_sizes_mb == [1.0, 16.0, 256.0]
    assert (ops.stall_timeout_floor_s, ops.stall_timeout_factor) == (300, 10.0)
    assert (ops.metrics_port, ops.metrics_ranks) == (9400, "all")
    assert (ops.loss_spike_ratio, ops.grad_norm_jump_ratio) == (0.3, 0.3)
    assert ops.mfu_target is None and ops.checkpoint_save_limit_s == 600 and ops.device_utilisation_min == 0.5
    assert ops.nonfinite_loss == "stop" and ops.mttr_limit_s == 300  # the seeds' 5 minutes
    assert ops.preflight_mode == "warn" and ops.burn_in_s == 0 and ops.log_event_window_s == 900
    testing = ops.testing
    assert testing.stall_at_step is None and testing.nan_at_step is None and testing.device_count is None


def test_bad_ops_values_are_all_reported_with_their_keys() -> None:
    found = problems_of(
        "recipe=tiny_sft",
        "ops.metrics_port=80",
        "ops.testing.stall_at_step=1",
        "ops.metrics_ranks=some",
        "train.profile_steps=[5,2]",
    )
    assert "greater than or equal to 1024" in found["ops.metrics_port"]
    assert "greater than or equal to 2" in found["ops.testing.stall_at_step"]
    assert "one or more sizes" in problems_of("recipe=tiny_sft", "ops.allreduce_sizes_mb=[]")["ops"]
    assert "'rank0', 'all'" in found["ops.metrics_ranks"]
    assert "1 <= first <= last" in found["train"]


def test_cross_section_rules_of_the_ops_layer() -> None:
    found = problems_of("recipe=tiny_sft", "ops.testing.stall_rank=5", "ops.metrics_port=29500")
    assert "ranks are 0..1" in found["ops.testing.stall_rank"]
    assert "include cluster.master_port 29500" in found["ops.metrics_port"]
    found = problems_of("recipe=llama3_8b_sft", "ops.metrics_port=29495")  # 8 processes: 29495..29502
    assert "29495-29502" in found["ops.metrics_port"]


@pytest.mark.parametrize(
    ("tracker", "needs"), [("wandb", "WANDB_API_KEY"), ("swanlab", "SWANLAB_API_KEY"), ("mlflow", "mlflow_uri")]
)
def test_an_online_tracker_without_what_it_needs_is_refused_at_build(
    tracker: str, needs: str, capsys: pytest.CaptureFixture
) -> None:
    found = problems_of("recipe=tiny_sft", f"train.report_to=[{tracker}]")
    assert f"{tracker} online needs" in found["train.tracking"] and needs in found["train.tracking"]
    assert "tracking.mode=offline" in found["train.tracking"]
    with pytest.raises(SystemExit) as info:
        cli_main(["build", "recipe=tiny_sft", f"train.report_to=[{tracker}]", "-o", "/nonexistent/never"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "train.tracking" in err and "Traceback" not in err
    resolve(["recipe=tiny_sft", f"train.report_to=[{tracker}]", "train.tracking.mode=offline"])  # builds offline


def test_hccl_aiv_mode_caps_the_exec_timeout_and_build_says_so() -> None:
    plan = resolve(["recipe=llama3_8b_sft", "+hw.env.HCCL_OP_EXPANSION_MODE=AIV"]).plan
    assert any("caps it at 1091 s" in w for w in plan.warnings)
    short = resolve(["recipe=llama3_8b_sft", "+hw.env.HCCL_OP_EXPANSION_MODE=AIV", "ops.checkpoint_save_limit_s=500"])
    assert not any("1091" in w for w in short.plan.warnings)


def test_fault_injection_is_a_build_warning() -> None:
    plan = resolve(["recipe=tiny_sft", "ops.testing.nan_at_step=3"]).plan
    assert any("injects faults (testing only)" in w and "nan_at_step=3" in w for w in plan.warnings)
    assert not any("injects" in w for w in resolve(["recipe=tiny_sft"]).plan.warnings)


# ------------------------------------------------------------------------------------------------- the numbers
def test_stall_timeout_follows_the_planned_step_time_with_a_floor() -> None:
    ops, _ = ops_of("recipe=llama3_8b_sft")
    assert ops.planned_step_time_s > 0
    assert ops.stall_timeout_s == max(300, -(-10 * ops.planned_step_time_s // 1))
    slow, _ = ops_of("recipe=llama3_70b_sft", "cluster.nodes=1", "parallel=zero3_offload")
    assert slow.stall_timeout_s == int(-(-10 * slow.planned_step_time_s // 1)) > 300  # a slow step lifts it
    low, _ = ops_of("recipe=llama3_8b_sft", "ops.stall_timeout_floor_s=30", "ops.stall_timeout_factor=2")
    assert low.stall_timeout_s == max(30, -(-2 * low.planned_step_time_s // 1))
    assert low.steady_timeout_s == max(low.stall_timeout_s, 1200) and low.startup_timeout_s == 1800


def test_checkpoint_size_and_storage_follow_the_parameters() -> None:
    ops, resolved = ops_of("recipe=llama3_8b_sft")  # ZeRO-2, bf16: 2 B weights + 12 B fp32 master and Adam
    params = resolved.plan.flops.params_total
    assert ops.checkpoint_bytes == params * 14 and ops.final_model_bytes == params * 2
    assert ops.storage_needed_bytes == -(-((3 + 1) * ops.checkpoint_bytes + ops.final_model_bytes) * 1.1 // 1)
    lora, resolved = ops_of("recipe=llama3_8b_lora")  # the adapter and its optimizer only
    assert lora.checkpoint_bytes == resolved.plan.flops.params_trainable * 14


def test_mfu_target_defaults_to_the_plans_assumption_as_mfu() -> None:
    """hw.assumed_mfu is the whole step's MFU (recomputation not counted): the run is watched against it."""
    ops, resolved = ops_of("recipe=llama3_8b_sft")
    assert ops.mfu_target == pytest.approx(resolved.recipe.hw.assumed_mfu)
    assert ops_of("recipe=llama3_8b_sft", "ops.mfu_target=0.5")[0].mfu_target == 0.5


def test_bandwidth_floor_is_a_fraction_of_the_link_the_allreduce_crosses() -> None:
    one, resolved = ops_of("recipe=llama3_8b_sft")
    assert (one.link, one.link_gbps, one.bandwidth_warn_gbps) == ("HCCS", 196.0, 98.0)
    two, _ = ops_of("recipe=qwen2.5_14b_sft", "ops.bandwidth_warn_fraction=0.8")
    assert (two.link, two.bandwidth_warn_gbps) == ("RoCE", 160.0)


# ------------------------------------------------------------------------------------------------- the files
def test_one_source_for_the_timeouts_in_recipe_yaml_and_launch_json() -> None:
    files = files_of("recipe=llama3_8b_sft")
    ops = yaml.safe_load(files["recipe.yaml"])["operations"]
    env = json.loads(files["launch.json"])["env"]
    assert env["HCCL_EXEC_TIMEOUT"] == str(ops["watchdog"]["steady_timeout_s"])
    assert env["HCCL_CONNECT_TIMEOUT"] == str(ops["watchdog"]["startup_timeout_s"]) == "1800"
    assert yaml.safe_load(files["recipe.yaml"])["training_arguments"]["ddp_timeout"] == 1800
    cuda = json.loads(files_of("recipe=llama3_8b_lora", "hw=a100_80g")["launch.json"])["env"]
    assert cuda["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert cuda["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "300"


def test_metrics_ports_on_the_job_and_in_the_podmonitor() -> None:
    files = files_of("recipe=llama3_8b_sft")
    job = yaml.safe_load(files["volcano-job.yaml"])
    template = job["spec"]["tasks"][0]["template"]
    ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
    assert ports == {"rendezvous": 29500, **{f"metrics-{i}": 9400 + i for i in range(8)}}
    monitor = yaml.safe_load(files["podmonitor.yaml"])
    assert monitor["kind"] == "PodMonitor" and monitor["metadata"]["namespace"] == job["metadata"]["namespace"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == [f"metrics-{i}" for i in range(8)]
    rank0 = yaml.safe_load(files_of("recipe=llama3_8b_sft", "ops.metrics_ranks=rank0")["podmonitor.yaml"])
    assert [e["port"] for e in rank0["spec"]["podMetricsEndpoints"]] == ["metrics-0"]


def test_metrics_off_means_no_monitoring_files_port_or_pin() -> None:
    files = files_of("recipe=tiny_sft", "ops.metrics_port=null")
    assert not {"podmonitor.yaml", "prometheusrule.yaml", "grafana-dashboard.json"} & set(files)
    job = yaml.safe_load(files["volcano-job.yaml"])
    assert [p["name"] for p in job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["ports"]] == ["rendezvous"]
    assert b"prometheus_client" not in files["Dockerfile"]
    assert b"prometheus_client==0.26.0" in files_of("recipe=tiny_sft")["Dockerfile"]


def test_alerts_use_the_recipes_thresholds_and_the_runtimes_metric_names() -> None:
    files = files_of(
        "recipe=tiny_sft", "ops.loss_spike_ratio=0.5", "ops.checkpoint_save_limit_s=900", "ops.mttr_limit_s=1200"
    )
    rule = yaml.safe_load(files["prometheusrule.yaml"])
    rules = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"]}
    assert set(rules) == {
        "RecipekitLossNotFinite",
        "RecipekitLossSpike",
        "RecipekitGradNormJump",
        "RecipekitMfuLow",
        "RecipekitCheckpointSlow",
        "RecipekitDeviceUtilisationLow",
        "RecipekitStalled",
        "RecipekitRecoverySlow",
        "RecipekitCollectiveTimeout",
        "RecipekitDeviceEccError",
        "RecipekitDeviceOutOfMemory",
    }
    assert rules["RecipekitLossSpike"]["expr"].endswith("> 0.5")
    assert rules["RecipekitRecoverySlow"]["expr"].startswith(metricnames.RECOVERY_SECONDS.name)
    assert rules["RecipekitRecoverySlow"]["expr"].endswith("> 1200")
    assert rules["RecipekitCheckpointSlow"]["expr"].startswith(metricnames.CHECKPOINT_SECONDS.name)
    assert "> 900" in rules["RecipekitCheckpointSlow"]["expr"]
    job = yaml.safe_load(files["volcano-job.yaml"])["metadata"]["name"]
    assert all(f'recipekit_job="{job}"' in r["expr"] for r in rules.values())


def test_the_dashboard_charts_every_metric_the_exporter_serves() -> None:
    board = json.loads(files_of("recipe=tiny_sft")["grafana-dashboard.json"])
    exprs = " ".join(t["expr"] for p in board["panels"] for t in p["targets"])
    assert all(m.name in exprs for m in metricnames.METRICS)
    assert len(board["panels"]) == len(dashboard_panels()) == len({p["id"] for p in board["panels"]})
    assert (
        board["templating"]["list"][1]["current"]["value"]
        == yaml.safe_load(files_of("recipe=tiny_sft")["volcano-job.yaml"])["metadata"]["name"]
    )


def test_promtool_accepts_the_rules_and_rejects_a_broken_one() -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus; .ci/run installs it)")
    rule = yaml.safe_load(files_of("recipe=llama3_8b_sft")["prometheusrule.yaml"])
    board = json.loads(files_of("recipe=llama3_8b_sft")["grafana-dashboard.json"])
    exprs = [t["expr"].replace("$job", "x") for p in board["panels"] for t in p["targets"]]
    assert promtool(rule, exprs).get("ok") is True
    rule["spec"]["groups"][0]["rules"][0]["expr"] = "recipekit_loss{ > 1"
    assert "promtool check rules failed" in promtool(rule, [])["error"]


def test_readme_documents_the_check_report_alerts_and_wiring() -> None:
    readme = files_of("recipe=llama3_8b_sft")["README.md"].decode()
    assert "cluster-check.json" in readme and "preflight failed" in readme and "HCCL_EXEC_TIMEOUT" in readme
    assert "kubectl apply -f podmonitor.yaml -f prometheusrule.yaml" in readme and "grafana-dashboard.json" in readme
    assert "ops.monitor_labels" in readme and "HCCL's ports 60000-60015" in readme


# ------------------------------------------------------------------------------------------- static checks
@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(["recipe=llama3_8b_sft"], tmp_path_factory.mktemp("ops") / "b", force=True).path


def test_static_checks_pass_on_a_built_bundle(bundle: Path) -> None:
    loaded = load_bundle(bundle)
    monitoring, timeouts = check_monitoring(loaded), check_operations(loaded)
    assert monitoring.status is Status.PASS, monitoring.findings
    assert timeouts.status is Status.PASS and "steady 1200 s (hccl)" in timeouts.reason


def _edited(bundle: Path, tmp_path: Path, name: str, change) -> Path:
    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    path = copy / name
    data = json.loads(path.read_text()) if name.endswith(".json") else yaml.safe_load(path.read_text())
    change(data)
    path.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data))
    rehash_manifest(copy)
    return copy


def test_a_podmonitor_that_misses_the_pods_fails(bundle: Path, tmp_path: Path) -> None:
    def retarget(doc):
        doc["spec"]["selector"]["matchLabels"] = {"app.kubernetes.io/name": "another-job"}
        doc["spec"]["podMetricsEndpoints"][0]["port"] = "metrics-9"

    result = check_monitoring(load_bundle(_edited(bundle, tmp_path, "podmonitor.yaml", retarget)))
    text = " ".join(str(f) for f in result.findings)
    assert result.status is Status.FAIL and "does not select the Job's pods" in text and "metrics-9" in text


def test_an_alert_on_a_metric_nobody_serves_fails(bundle: Path, tmp_path: Path) -> None:
    def rename(doc):
        doc["spec"]["groups"][0]["rules"][1]["expr"] = doc["spec"]["groups"][0]["rules"][1]["expr"].replace(
            "recipekit_loss_jump_ratio", "recipekit_loss_spike"
        )

    result = check_monitoring(load_bundle(_edited(bundle, tmp_path, "prometheusrule.yaml", rename)))
    assert result.status is Status.FAIL and "recipekit_loss_spike" in str(result.findings[0])


def test_a_hand_edited_collective_timeout_fails(bundle: Path, tmp_path: Path) -> None:
    result = check_operations(
        load_bundle(_edited(bundle, tmp_path, "launch.json", lambda d: d["env"].update(HCCL_EXEC_TIMEOUT="1836")))
    )
    assert result.status is Status.FAIL and "HCCL_EXEC_TIMEOUT" in str(result.findings[0])


def test_validate_cli_reports_the_ops_checks(bundle: Path) -> None:
    from recipekit.cli.validate import validate_command

    result = CliRunner().invoke(validate_command, [str(bundle), "--json"])
    checks = {c["id"]: c["status"] for c in json.loads(result.stdout)["checks"]}
    assert checks["ops.monitoring"] == "pass" and checks["ops.timeouts"] == "pass"
