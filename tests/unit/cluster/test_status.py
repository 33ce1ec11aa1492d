"""``recipekit status`` through the real kubernetes client against recorded moments of a run: a PodGroup Pending for
devices and a taint, one held back by its queue's quota, pods that cannot mount the missing run key, a run Volcano
restarted (with its progress read from the volume), a finished Job and a failed one — each said in 80 columns, with
the exit code the help promises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from recipekit.bundle.documents import run_key_command
from recipekit.cluster.reasons import Note, node_reasons, queue_reasons, why_pending
from recipekit.runtime.boundary import filenames
from tests.unit.cluster.apiserver import JOB, NAMESPACE, RecordedAPIServer, serve
from tests.unit.cluster.conftest import command, fits
from tests.unit.runfixtures import losses, write_run

pytest.importorskip("kubernetes", reason="the cluster commands need the kubernetes client (the test extra)")


def flat(text: str) -> str:
    return " ".join(text.split())


def test_a_pending_podgroup_says_which_nodes_lack_devices_and_which_are_tainted(
    server: RecordedAPIServer, tmp_path: Path
) -> None:
    serve(server, "pending-devices.yaml")
    result = command(server, tmp_path, "status", JOB)
    assert result.exit_code == 0, result.output
    said = flat(result.stdout)
    assert "job Pending, attempt 1 of 3" in said
    assert "podgroup Inqueue: 0 pod(s) running (gang of 2)" in said
    assert "devices: 3 of 4 nodes: not enough huawei.com/Ascend910 free" in said
    assert "taints: 1 of 4 nodes: taint {dedicated: inference} not tolerated (cluster.placement.tolerations)" in said
    assert "worker-0 Pending restarts 0 attempt 1" in said and fits(result)


def test_a_podgroup_its_queue_has_no_room_for(server: RecordedAPIServer, tmp_path: Path) -> None:
    serve(server, "pending-quota.yaml")
    result = command(server, tmp_path, "status", JOB)
    assert result.exit_code == 0, result.output
    said = flat(result.stdout)
    assert "podgroup Pending: 0 pod(s) running (gang of 2)" in said
    assert "queue: queue llm's quota: insufficient huawei.com/Ascend910 (wait, or a queue with room)" in said
    assert "pods none yet" in said and fits(result)


def test_pods_that_cannot_mount_the_run_key_name_the_command_that_makes_it(
    server: RecordedAPIServer, tmp_path: Path
) -> None:
    serve(server, "missing-secret.yaml")
    result = command(server, tmp_path, "status", JOB)
    assert result.exit_code == 0, result.output
    said = flat(result.stdout)
    assert (
        f"volume: Secret recipekit-run-key is missing: the pods cannot mount it ({run_key_command(NAMESPACE)})" in said
    )
    assert "worker-1 Pending restarts 0 attempt 1 ContainerCreating" in said and fits(result)


def _volume_with_run(tmp_path: Path, steps: int = 120) -> Path:
    """The shared volume as mounted here, holding the run's output directory: 120 steps logged, still training."""
    volume = tmp_path / "pvc"
    output = volume / "runs" / JOB
    write_run(output, losses(steps, start=2.5, slope=0.005), kill_after=80, resume_step=80)
    metrics = output / filenames.METRICS_FILE
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join(line for line in lines if '"done"' not in line and "train_runtime" not in line) + "\n")
    return volume


def _run_files(server: RecordedAPIServer) -> None:
    """The Job's ConfigMap of run files: recipe.yaml names the output directory on the volume and the total steps."""
    recipe = {
        "recipe": {"cluster": {"mount_path": "/mnt/shared"}},
        "plan": {"job_name": JOB, "total_steps": 2000},
        "training_arguments": {"output_dir": f"/mnt/shared/runs/{JOB}"},
    }
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{JOB}-run-files", "namespace": NAMESPACE},
        "data": {"recipe.yaml": yaml.safe_dump(recipe), "launch.json": json.dumps({"job_name": JOB})},
    }
    server.answer("GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps/{JOB}-run-files", configmap)


def test_a_restarted_run_shows_its_attempt_its_pods_restarts_and_its_progress(
    server: RecordedAPIServer, tmp_path: Path
) -> None:
    serve(server, "restarted.yaml")
    _run_files(server)
    result = command(server, tmp_path, "status", JOB, "--volume", str(_volume_with_run(tmp_path)))
    assert result.exit_code == 0, result.output
    said = flat(result.stdout)
    assert "job Running, attempt 2 of 3" in said and "podgroup Running: 2 pod(s) running" in said
    assert "worker-0 Running restarts 1 attempt 2" in said and "worker-1 Running restarts 0 attempt 2" in said
    # 120 of 2000 steps at a steady 0.55 s/step (runfixtures): 1880 × 0.55 s = 17 min
    assert "training step 120 of 2000 · loss 1.9050 · 1,000 tokens/s per device · 0.55 s/step" in said
    assert "ETA 17 min · 2 start(s) of train.py" in said and "\u00a0" not in result.stdout
    assert "waiting" not in said and fits(result)


def test_without_the_volume_status_says_where_to_point_it(server: RecordedAPIServer, tmp_path: Path) -> None:
    serve(server, "restarted.yaml")
    _run_files(server)
    result = command(server, tmp_path, "status", JOB)
    assert result.exit_code == 0
    assert "--volume DIR: where the shared volume is mounted here" in flat(result.stdout) and fits(result)


def test_a_finished_job_exits_0_and_a_failed_one_1(server: RecordedAPIServer, tmp_path: Path) -> None:
    serve(server, "finished.yaml")
    result = command(server, tmp_path, "status", JOB)
    assert result.exit_code == 0, result.output
    said = flat(result.stdout)
    assert "job Completed, attempt 2 of 3" in said and "podgroup Completed" in said
    assert "worker-1 Succeeded restarts 0 attempt 2" in said and fits(result)
    assert not any(method != "GET" for method, _ in server.asked())  # status only reads
    serve(server, "finished.yaml", job_status="failed_job_status")
    result = command(server, tmp_path, "status", JOB)
    assert result.exit_code == 1 and "job Failed, attempt 4 of 3" in flat(result.stdout)


def test_status_of_a_run_that_does_not_exist_exits_2(server: RecordedAPIServer, tmp_path: Path) -> None:
    result = command(server, tmp_path, "status", "no-such-run")
    assert result.exit_code == 2 and "no-such-run: no Volcano Job of that name in namespace team-a" in result.stderr


# ------------------------------------------------------------------------------- Volcano's sentences, one by one
def test_the_fit_error_histogram_is_read_item_by_item() -> None:
    message = (
        "3/3 tasks in gang unschedulable: pod group is not ready, 3 Pending, 3 minAvailable; Pending: 3 "
        "Unschedulable. Origin reason is j-worker-0: 0/7 nodes are unavailable: 1 node(s) didn't match Pod's node "
        "affinity/selector, 1 node(s) were unschedulable, 2 node(s) had untolerated taint {node.kubernetes.io/"
        "unreachable: }, 3 Insufficient huawei.com/Ascend910."
    )
    lines = [r.line() for r in node_reasons(message)]
    assert lines[0].startswith("selector: 1 of 7 nodes: not matched by the node selector")
    assert lines[1] == "cordoned: 1 of 7 nodes: cordoned (unschedulable)"
    assert "2 of 7 nodes: taint {node.kubernetes.io/unreachable: } not tolerated" in lines[2]
    assert "3 of 7 nodes: not enough huawei.com/Ascend910 free" in lines[3]


def test_a_closed_or_missing_queue_and_an_overused_cluster() -> None:
    assert queue_reasons("llm", "Closed", [])[0].line().startswith("queue: queue llm is Closed")
    assert queue_reasons("llm", "missing", [])[0].line().startswith("queue: queue llm does not exist")
    notes = [
        Note("PodGroup", "pg", "Unschedulable", "resource in cluster is overused: overused nvidia.com/gpu", "Normal")
    ]
    assert "cluster overused: overused nvidia.com/gpu" in queue_reasons("llm", "Open", notes)[0].line()


def test_an_image_that_cannot_be_pulled_and_an_unknown_sentence() -> None:
    waiting = {"j-worker-0": ("ImagePullBackOff", 'Back-off pulling image "registry.example.com/llm/x@sha256:ab"')}
    reasons = why_pending(None, "llm", "Open", [], waiting, "kubectl ...")
    assert reasons[0].what == "image" and "cluster.image_pull_secrets" in reasons[0].hint
    odd = why_pending("1/1 tasks in gang unschedulable: \x1b[31mred\x1b[0m", "llm", "Open", [], {}, "")
    assert odd[0].what == "scheduler" and "\x1b" not in odd[0].detail  # Volcano's words, made safe


def test_a_bundle_reads_its_progress_from_its_output_directory_on_the_volume(tmp_path: Path) -> None:
    from recipekit.bundle.build import build
    from recipekit.cluster.progress import from_bundle

    bundle = build(["recipe=tiny_sft"], tmp_path / "b", force=True).path
    output = yaml.safe_load((bundle / "recipe.yaml").read_text())["training_arguments"]["output_dir"]
    volume = tmp_path / "pvc"
    write_run(volume / output.removeprefix("/mnt/shared/"), losses(6))
    progress, note = from_bundle(bundle, volume)
    assert note is None and progress is not None
    assert (progress.step, progress.total_steps, progress.done) == (6, 8, True)  # plan.json's 8 steps; done: no ETA
    assert progress.eta_s is None and progress.starts == 1
    missing, why = from_bundle(bundle, None)  # the pods' path, not on this machine
    assert missing is None and "--volume DIR" in why
