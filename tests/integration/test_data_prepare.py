"""``recipekit data prepare`` ahead of time, then the Job: it finds the shards and trains without preparing.

The command runs the bundle's own prepare step in a child (the bundle alone on PYTHONPATH) with local worker
processes; train.py, started afterwards as a pod starts it, computes the same fingerprint and reuses the shards.
Slow: two children import the training stack.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.cli import main
from recipekit.runtime.boundary import filenames, metricslog
from recipekit.runtime.volume import manifest, trust

pytest.importorskip("transformers")

from tests.integration.test_train_runs import (  # noqa: E402
    RUN_KEY,
    make_bundle,
    output_dir,
    records,
    run_train,
    succeeded,
)

#: The Job's run key (its Secret): data prepared ahead is sealed with it, or the keyed Job will not reuse it.
KEYED = {trust.KEY_ENV: str(RUN_KEY)}

pytestmark = pytest.mark.slow


def test_prepare_ahead_then_the_job_reuses_the_shards(tmp_path: Path) -> None:
    bundle = make_bundle(
        tmp_path, "messages", "data=chat", "data.max_len=128", "data.shard_mib=0.004", "train.max_steps=2"
    )
    result = CliRunner().invoke(main, ["data", "prepare", str(bundle), "--workers", "2", "--json"], env=KEYED)
    assert result.exit_code == 0, result.output
    done = json.loads(result.stdout)
    assert done["workers"] == 2 and done["chunks"] >= 3 and not done["reused"] and done["row_kind"] == "packed"
    directory = Path(done["directory"])
    assert directory.parent == tmp_path / "runs" / "prepared" and done["manifest"] == str(directory / "manifest.json")
    found = manifest.read_manifest(directory)
    assert manifest.split_counts(found) == (done["train_rows"], done["train_tokens"])
    assert (output_dir(bundle) / filenames.RANDOM_INIT_DIR / "tokenizer.json").is_file()  # the twin, made here

    trained = run_train(bundle)
    assert succeeded(trained)
    (data,) = records(output_dir(bundle), metricslog.EVENT_DATA)
    assert data["reused"] is True and data["fingerprint"] == done["fingerprint"]

    again = CliRunner().invoke(main, ["data", "prepare", str(bundle), "--workers", "1"], env=KEYED)
    assert (
        again.exit_code == 0
        and "found prepared" in again.stdout
        and f"data.num_rows={done['train_rows']}" in again.stdout
    )


def test_bad_data_fails_the_command_with_one_line(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, "alpaca")
    data = tmp_path / "data.jsonl"
    data.write_text(data.read_text() + '{"instruction": "x"}\n')
    process = subprocess.run(
        [sys.executable, "-m", "recipekit.cli", "data", "prepare", str(bundle), "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == 2, process.stderr
    assert "Traceback" not in process.stderr
    assert f"data error: {data}:65: field 'output': missing" in process.stderr


def test_verify_finds_the_bundles_shards_by_fingerprint_and_fails_on_a_damaged_one(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, "alpaca", "data.shard_mib=0.004")
    nothing = CliRunner().invoke(main, ["data", "verify", str(bundle)])  # the twin is not made yet: nothing prepared
    assert nothing.exit_code == 2
    prepared = CliRunner().invoke(main, ["data", "prepare", str(bundle), "--workers", "1", "--json"])
    assert prepared.exit_code == 0, prepared.output
    directory = Path(json.loads(prepared.stdout)["directory"])
    result = CliRunner().invoke(main, ["data", "verify", str(bundle), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] and report["directory"] == str(directory) and report["files"] >= 6
    shard = directory / manifest.SHARDS / "train-000000.bin"
    shard.unlink()
    result = CliRunner().invoke(main, ["data", "verify", str(bundle)])
    assert result.exit_code == 1
    assert f"missing: {shard}: listed in the manifest, not there" in result.stdout


def test_verify_refuses_a_streaming_bundle(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, "alpaca", "data.streaming=true", "train.max_steps=2", "data.eval_fraction=0")
    result = CliRunner().invoke(main, ["data", "verify", str(bundle)])
    assert result.exit_code == 2 and "have no shards to verify" in result.output
