"""``recipekit restart`` (handover/restart.py): the overlay renders the bundle's objects as built with the Job's
trainer carrying the request, the run files and their digest untouched; the kubectl lines fit 80 columns; bad input
is one line and exit 2; ``runs history`` lists an applied restart apart from the recoveries."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from recipekit.bundle.build import build
from recipekit.cli import main
from recipekit.runtime.volume import recovery, restart
from recipekit.validate.dryrun.restartrun import overlay_env

KUBECTL = shutil.which("kubectl")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(["recipe=tiny_sft"], tmp_path_factory.mktemp("r") / "tiny_sft").path


def test_restart_writes_an_overlay_beside_the_bundle_and_prints_the_kubectl_lines(bundle: Path) -> None:
    before = {p.name: p.read_bytes() for p in bundle.iterdir() if p.is_file()}
    result = CliRunner().invoke(main, ["restart", str(bundle), "--from", "checkpoint-4"])
    assert result.exit_code == 0, result.output
    overlay = bundle.parent / "tiny_sft-restart"
    request = json.loads((overlay / "restart.json").read_text())
    assert request["from"] == "checkpoint-4"
    env = overlay_env(overlay)
    assert restart.parse(env[restart.RESTART_ENV]).start_from == "checkpoint-4"
    assert "kubectl -n default delete vcjob tiny-sft-" in result.output
    assert f"kubectl apply -k {overlay}" in result.output
    assert "recipekit runs history /mnt/shared/runs/tiny-sft-" in result.output
    assert all(len(line) <= 80 for line in result.output.splitlines() if not line.startswith("  "))  # paths indented
    assert {p.name: p.read_bytes() for p in bundle.iterdir() if p.is_file()} == before  # the bundle untouched
    again = CliRunner().invoke(main, ["restart", str(bundle), "--fresh"])  # the next restart replaces the overlay
    assert again.exit_code == 0 and json.loads((overlay / "restart.json").read_text())["from"] is None


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (its kustomize renders the overlay)")
def test_kustomize_renders_the_bundle_with_the_request_and_the_run_files_digest_unchanged(bundle: Path) -> None:
    CliRunner().invoke(main, ["restart", str(bundle), "--from", "checkpoint-4", "-o", str(bundle.parent / "o")])
    rendered = subprocess.run([KUBECTL, "kustomize", str(bundle.parent / "o")], capture_output=True, text=True)
    assert rendered.returncode == 0, rendered.stderr
    plain = subprocess.run([KUBECTL, "kustomize", str(bundle)], capture_output=True, text=True).stdout
    objects, built = list(yaml.safe_load_all(rendered.stdout)), list(yaml.safe_load_all(plain))
    assert [o["kind"] for o in objects] == [o["kind"] for o in built]
    assert objects[0] == built[0]  # the run files' ConfigMap, as built
    env = objects[1]["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["env"]
    built_env = built[1]["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["env"]
    assert env[:-1] == built_env and env[-1]["name"] == restart.RESTART_ENV  # the digest kept, one more


def test_bad_restart_input_is_one_line_and_exit_2(bundle: Path, tmp_path: Path) -> None:
    for args, says in (
        ([], "give --from checkpoint-N or --fresh"),
        (["--from", "checkpoint-4", "--fresh"], "give --from checkpoint-N or --fresh"),
        (["--from", "/out/checkpoint-4"], "a checkpoint's directory name"),
        (["--fresh", "-o", str(bundle / "x")], "inside the bundle"),
    ):
        result = CliRunner().invoke(main, ["restart", str(bundle), *args])
        assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output, args
    (tmp_path / "taken").mkdir()
    result = CliRunner().invoke(main, ["restart", str(bundle), "--fresh", "-o", str(tmp_path / "taken")])
    assert result.exit_code == 2 and "is not a restart overlay" in result.output
    result = CliRunner().invoke(main, ["restart", str(tmp_path), "--fresh"])
    assert result.exit_code == 2 and "not a bundle" in result.output


def test_a_checkpoint_missing_from_a_reachable_output_directory_is_refused(bundle: Path, tmp_path: Path) -> None:
    output = yaml.safe_load((bundle / "recipe.yaml").read_text())["training_arguments"]["output_dir"]
    local = tmp_path / "b"
    shutil.copytree(bundle, local)
    recipe = (local / "recipe.yaml").read_text().replace(output, str(tmp_path / "out"))
    (local / "recipe.yaml").write_text(recipe)
    (tmp_path / "out" / "checkpoint-2").mkdir(parents=True)
    result = CliRunner().invoke(main, ["restart", str(local), "--from", "checkpoint-4"])
    assert result.exit_code == 2 and "checkpoint-4 is not in" in result.output and "checkpoint-2" in result.output
    result = CliRunner().invoke(main, ["restart", str(local), "--from", "checkpoint-2"])
    assert result.exit_code == 0 and "checkpoint-2 is there" in result.output


def test_runs_history_lists_the_restarts_apart_from_the_recoveries(tmp_path: Path) -> None:
    log = recovery.RecoveryLog(tmp_path, enabled=True, clock=lambda: 1_700_000_000.0, environ={})
    log.started(None, None, 2)
    log.step(6)
    log.restarted("abcdef123456", "checkpoint-4", ["checkpoint-6"])
    log.started(4, str(tmp_path / "checkpoint-4"), 2, restart="abcdef123456")
    log.step(5)
    log.done(8)
    log.restarted("123456abcdef", None, ["checkpoint-4", "checkpoint-8"])
    log.started(None, None, 2, restart="123456abcdef")
    result = CliRunner().invoke(main, ["runs", "history", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "3 start(s), 0 recovery(ies)" in result.output
    assert "restart 1 (abcdef123456) asked for: from checkpoint-4" in result.output
    assert "set aside: checkpoint-6" in result.output
    assert "restart 2 (123456abcdef) asked for: fresh, from step 0" in result.output
    document = json.loads(CliRunner().invoke(main, ["runs", "history", str(tmp_path), "--json"]).output)
    assert [r["from"] for r in document["restarts_asked"]] == ["checkpoint-4", None] and document["recoveries"] == []
    assert document["restarts"] == 0  # the count of recoveries; the restarts asked for are restarts_asked
