"""Restarts a user asks for, on simulated pods: validate's help example
``recipekit validate bundles/tiny_sft --dry-run --restart checkpoint-4,fresh``, run here as a user pastes it
(test_help_examples leaves it to this file, which reads what it did from the kept dry run's report).

The run completes, then is restarted twice from the same bundle exactly as on a cluster: `recipekit restart`'s own
code writes the kustomize overlay, the request is read back out of its patch, and every pod starts again with it.
The first restart continues from checkpoint-4 (checkpoint-8 set aside) and retrains steps 5-8 to the same losses;
the second starts fresh (both checkpoints set aside). `recipekit runs history` lists both, and no recovery.
Slow: about two minutes.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.cli import main
from recipekit.runtime.volume.restart import SUPERSEDED_DIR
from recipekit.validate.dryrun.workdir.kept import kept_runs, runs_dir
from tests.integration.test_dryrun import processes_under, reported
from tests.integration.test_help_examples import run_example

pytestmark = pytest.mark.slow

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
    pytest.skip("the training stack is not installed (pip install 'recipekit[train]')", allow_module_level=True)


LINE = "recipekit validate bundles/tiny_sft --dry-run --restart checkpoint-4,fresh"


def test_a_restart_from_a_checkpoint_and_a_fresh_start_each_recorded_in_runs_history(tmp_path: Path) -> None:
    done = run_example(LINE, tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    bundle = tmp_path / "bundles" / "tiny_sft"
    (work,) = kept_runs(runs_dir(bundle))
    results = reported(work)
    assert processes_under(work) == []
    assert all(r["status"] == "pass" for r in results.values() if r["id"].startswith("dryrun.")), results
    restarts = results["dryrun.restart"]["details"]["restarts"]
    assert [r["from"] for r in restarts] == ["checkpoint-4", None]
    assert all(r["final_step"] == 8 for r in restarts)
    assert restarts[0]["retrained_steps"] == [5, 6, 7, 8] and restarts[0]["retrained_loss_max_rel_diff"] <= 1e-4

    history = CliRunner().invoke(main, ["runs", "history", str(work)])
    assert history.exit_code == 0, history.output
    assert "3 start(s), 0 recovery(ies)" in history.output
    assert f"({restarts[0]['id']}) asked for: from checkpoint-4" in history.output
    assert f"({restarts[1]['id']}) asked for: fresh, from step 0" in history.output
    document = json.loads(CliRunner().invoke(main, ["runs", "history", str(work), "--json"]).output)
    assert [r["superseded"] for r in document["restarts_asked"]] == [["checkpoint-8"], ["checkpoint-4", "checkpoint-8"]]
    output = next((work / "shared" / "runs").glob("tiny-sft-*"))
    assert sorted(p.name for p in (output / SUPERSEDED_DIR / restarts[1]["id"]).iterdir()) == [
        "checkpoint-4",
        "checkpoint-8",
    ]
    assert (work / "restart-1" / "kustomization.yaml").is_file()  # the overlays the pods ran from
    assert sorted(p.name for p in (tmp_path / "bundles").iterdir()) == [".dryrun", "tiny_sft"]  # nothing beside it
