"""A run imports only the tracker clients it reports to (runtime/ops/trackers/clients.py): DeepSpeed's own import of
mlflow, seconds of every rank's start, is skipped where the run does not report to MLflow."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from recipekit.runtime.ops.trackers.clients import reported_to

#: A fresh interpreter keeps out what ``report_to`` does not name, then imports DeepSpeed's autotuner (the module
#: that imports mlflow when it can) and says what it found.
PROBE = """
import importlib.util, json, sys
from recipekit.runtime.ops.trackers.clients import keep_out_unused
kept_out = keep_out_unused(json.loads(sys.argv[1]))
from deepspeed.autotuning import autotuner
print(json.dumps({"kept_out": kept_out, "deepspeed_has_mlflow": autotuner.has_mlflow,
                  "mlflow_found": importlib.util.find_spec("mlflow") is not None}))
"""


@pytest.mark.parametrize(
    "report_to, used",
    [("none", set()), (None, set()), ("all", {"wandb", "mlflow", "swanlab"}), ("mlflow", {"mlflow"}),
     (["tensorboard", "wandb"], {"wandb"})],
)  # fmt: skip
def test_report_to_names_the_trackers_the_trainer_reports_to(report_to: object, used: set[str]) -> None:
    assert reported_to(report_to) == used


@pytest.mark.parametrize("report_to", [["tensorboard"], ["tensorboard", "mlflow"]])
def test_deepspeed_imports_mlflow_only_for_a_run_that_reports_to_it(report_to: list[str]) -> None:
    pytest.importorskip("mlflow")
    probe = subprocess.run(
        [sys.executable, "-I", "-c", PROBE, json.dumps(report_to)], capture_output=True, text=True, timeout=300
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    reports_to_mlflow = "mlflow" in report_to
    assert found["deepspeed_has_mlflow"] is reports_to_mlflow and found["mlflow_found"] is reports_to_mlflow
    assert ("mlflow" in found["kept_out"]) is not reports_to_mlflow and "wandb" in found["kept_out"]
