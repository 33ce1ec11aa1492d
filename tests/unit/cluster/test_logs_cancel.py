"""``recipekit logs`` and ``cancel``, and how the cluster commands fail, through the real kubernetes client: a pod's
log streamed with every control character made safe, a pod with no log yet, a pod that does not exist; the Job
deleted in the background; a cluster out of reach, credentials refused and an unknown context, each in one line
with its exit code."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from recipekit.validate.shared.ports import free_port
from tests.unit.cluster.apiserver import JOB, JOB_PATH, NAMESPACE, RecordedAPIServer, Request, load, serve, status
from tests.unit.cluster.conftest import command, fits, invoke

pytest.importorskip("kubernetes", reason="the cluster commands need the kubernetes client (the test extra)")

LOG_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods/{JOB}-worker-1/log"


def test_logs_stream_the_chosen_pod_with_control_characters_escaped(server: RecordedAPIServer, tmp_path: Path) -> None:
    serve(server, "restarted.yaml")
    text = (
        "[rank 1] loading checkpoint-80\n"
        "\x1b]0;owned\x07\x1b[31mred\x1b[0m\ttab\n"
        "10%|#         | 1/10\r50%|#####     | 5/10\r100%|##########| 10/10\n"
        "{'loss': 1.905, 'step': 120}\n"
    )
    server.answer("GET", LOG_PATH, text)
    result = command(server, tmp_path, "logs", JOB, "--pod", "1", "-f")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "[rank 1] loading checkpoint-80"
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert lines[1].startswith("\\x1b]0;owned\\x07\\x1b[31mred\\x1b[0m ") and lines[1].endswith(" tab")
    assert "\t" not in result.stdout  # tabs expanded, every escape written out
    assert lines[2] == "100%|##########| 10/10"  # what the terminal would have shown of the progress bar
    asked = [r for r in server.requests if r.path == LOG_PATH][0]
    assert (asked.arg("container"), asked.arg("follow")) == ("trainer", "true")


def test_a_pod_without_a_log_yet_exits_1_and_a_pod_out_of_range_2(server: RecordedAPIServer, tmp_path: Path) -> None:
    serve(server, "missing-secret.yaml")
    waiting = load("refusals.yaml")["pod_log_waiting"]
    server.answer("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{JOB}-worker-0/log", waiting, 400)
    result = command(server, tmp_path, "logs", JOB)
    assert result.exit_code == 1
    assert 'no log yet: container "trainer" in pod' in " ".join(result.stderr.split()) and fits(result)
    result = command(server, tmp_path, "logs", JOB, "--pod", "2")
    assert result.exit_code == 2 and "--pod: 2: the run has pods 0 to 1" in result.stderr


def test_cancel_deletes_the_job_in_the_background(server: RecordedAPIServer, tmp_path: Path) -> None:
    serve(server, "restarted.yaml")
    deleted = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
               "details": {"name": JOB, "group": "batch.volcano.sh", "kind": "jobs", "uid": "6f1c2b7e"}}  # fmt: skip
    server.answer("DELETE", JOB_PATH, deleted)
    result = command(server, tmp_path, "cancel", JOB)
    assert result.exit_code == 0, result.output
    assert f"cancelled {JOB} in namespace {NAMESPACE} (it was Running)" in " ".join(result.stdout.split())
    delete = [r for r in server.requests if r.method == "DELETE"][0]
    assert (
        delete.arg("propagationPolicy") == "Background" or (delete.body or {}).get("propagationPolicy") == "Background"
    )
    assert fits(result)


def test_cancel_of_a_run_that_is_not_there_exits_2(server: RecordedAPIServer, tmp_path: Path) -> None:
    result = command(server, tmp_path, "cancel", JOB)
    assert result.exit_code == 2 and f"{JOB}: no Volcano Job of that name in namespace {NAMESPACE}" in result.stderr


def test_a_cluster_out_of_reach_exits_4_in_one_line(tmp_path: Path) -> None:
    port = free_port()  # a port nothing listens on
    with RecordedAPIServer() as server:
        kubeconfig = server.kubeconfig(tmp_path)
    config = yaml.safe_load(kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{port}"
    kubeconfig.write_text(yaml.safe_dump(config))
    result = invoke("status", JOB, "--kubeconfig", str(kubeconfig))
    assert result.exit_code == 4, result.output
    assert result.stderr.startswith(f"error: cannot reach the API server http://127.0.0.1:{port} (context recorded)")
    assert "Traceback" not in result.output and fits(result)


def test_refused_credentials_exit_4_and_an_unknown_context_2(server: RecordedAPIServer, tmp_path: Path) -> None:
    def unauthorized(request: Request) -> tuple[int, dict]:
        return 401, status(401, "Unauthorized", "Unauthorized")

    server.handle("GET", JOB_PATH, unauthorized)
    result = command(server, tmp_path, "status", JOB)
    assert result.exit_code == 4 and "refused the credentials of context recorded (401 Unauthorized)" in " ".join(
        result.stderr.split()
    )
    assert server.requests[0].path == JOB_PATH  # the real client sent its bearer token: the server saw the request
    result = command(server, tmp_path, "status", JOB, "--context", "prod")
    assert (
        result.exit_code == 2
        and "'prod' is not a context of" in result.stderr
        and "contexts: recorded" in result.stderr
    )


def test_the_namespace_is_the_flag_s_then_the_context_s(server: RecordedAPIServer, tmp_path: Path) -> None:
    serve(server, "finished.yaml")
    other = JOB_PATH.replace(f"/namespaces/{NAMESPACE}/", "/namespaces/other/")
    result = command(server, tmp_path, "status", JOB, "-n", "other")
    assert result.exit_code == 2 and "namespace other" in result.stderr
    assert server.requests[-1].path == other
    server.requests.clear()
    result = command(server, tmp_path, "status", JOB)  # the kubeconfig's context names team-a
    assert result.exit_code == 0 and server.requests[0].path == JOB_PATH


def test_kubeconfig_files_merge_as_kubectl_merges_them(server: RecordedAPIServer, tmp_path: Path) -> None:
    """$KUBECONFIG's files together: the current context from the first that names one, a context from any; a
    kubeconfig without a current context works with --context; a broken one is one line, exit 2."""
    from click.testing import CliRunner

    from recipekit.cli import main

    serve(server, "finished.yaml")
    full = yaml.safe_load(server.kubeconfig(tmp_path).read_text())
    first = tmp_path / "first"
    first.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "recorded"}))
    second = tmp_path / "second"
    second.write_text(yaml.safe_dump({k: v for k, v in full.items() if k != "current-context"}))
    runner = CliRunner(env={"COLUMNS": "80", "KUBECONFIG": f"{first}:{second}"})
    result = runner.invoke(main, ["status", JOB])
    assert result.exit_code == 0, result.output
    result = invoke("status", JOB, "--kubeconfig", str(second))
    assert result.exit_code == 2 and "no current context (--context NAME; contexts: recorded)" in result.stderr
    result = invoke("status", JOB, "--kubeconfig", str(second), "--context", "recorded")
    assert result.exit_code == 0, result.output
    broken = tmp_path / "broken"
    broken.write_text("clusters: [\n")
    result = invoke("status", JOB, "--kubeconfig", str(broken))
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 2  # "error: 1 problem:" and the line
    assert "kubeconfig cannot be read" in result.stderr
