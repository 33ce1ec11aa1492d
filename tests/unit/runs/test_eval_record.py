"""The evaluation after training's record (runtime/volume/evalrecord.py): made from lm-evaluation-harness's result
dictionary, written without following a link, read back typed and bounded; and the report's rows and compare's
table made of it (runs/evaluation.py)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from recipekit.runs.compare import compare
from recipekit.runs.evaluation import compare_scores, eval_rows
from recipekit.runs.runlog import RunLog
from recipekit.runs.runsummary import summary
from recipekit.runtime.boundary import filenames
from recipekit.runtime.volume import evalrecord
from recipekit.runtime.volume.evalrecord import EvalRecord, EvalUnreadable, read_eval, scores_of, write_eval

#: The shape simple_evaluate returns (lm_eval 0.4.13, as the dry run's task printed it), trimmed to what is read.
HARNESS_RESULT = {
    "results": {
        "arc_easy": {
            "alias": "arc_easy",
            "acc,none": 0.75,
            "acc_stderr,none": 0.02,
            "acc_norm,none": 0.7,
            "acc_norm_stderr,none": "N/A",
        },
        "tiny": {"name": "tiny", "sample_len": 6, "acc,none": 1.0, "acc_stderr,none": "N/A"},
    },
    "n-samples": {"arc_easy": {"original": 2376, "effective": 100}, "tiny": {"original": 8, "effective": 6}},
    "n-shot": {"arc_easy": 0, "tiny": 0},
}


def _record(ok: bool = True, value: float = 0.75) -> EvalRecord:
    result = json.loads(json.dumps(HARNESS_RESULT))
    result["results"]["arc_easy"]["acc,none"] = value
    return EvalRecord("lm_eval", "0.4.13", "/out", ok, "" if ok else "OSError: no", 3.5, 100, scores_of(result))


def test_scores_are_each_metric_with_its_stderr_items_and_shots() -> None:
    scores = scores_of(HARNESS_RESULT)
    assert [(s.task, s.metric, s.value, s.stderr, s.samples) for s in scores] == [
        ("arc_easy", "acc", 0.75, 0.02, 100),
        ("arc_easy", "acc_norm", 0.7, None, 100),  # the harness's "N/A" stderr is none
        ("tiny", "acc", 1.0, None, 6),
    ]
    assert {s.n_shot for s in scores} == {0}


def test_written_then_read_back_equal(tmp_path: Path) -> None:
    record = _record()
    path = write_eval(tmp_path, record)
    assert path.name == filenames.EVAL_FILE
    assert read_eval(tmp_path) == record
    assert read_eval(tmp_path / "elsewhere") is None  # a run that did not evaluate


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[1, 2]", "not a JSON object"),
        ('{"ok": true, "scores": 3}', "scores: not a list"),
        ('{"ok": "yes", "scores": []}', "ok: not true or false"),
        (
            '{"ok": true, "harness": "lm_eval", "version": "1", "model": "m", "reason": "", '
            '"scores": [{"value": "1"}]}',
            "scores[0].value: not a finite number",
        ),
        ("[" * 100 + "]" * 100, "nested more than 8 levels"),
    ],
)
def test_a_misshapen_record_is_one_line_naming_the_file(tmp_path: Path, text: str, reason: str) -> None:
    (tmp_path / filenames.EVAL_FILE).write_text(text, encoding="utf-8")
    with pytest.raises(EvalUnreadable, match=re.escape(reason)) as caught:
        read_eval(tmp_path)
    assert str(tmp_path / filenames.EVAL_FILE) in str(caught.value) and "\n" not in str(caught.value)


def test_a_record_larger_than_the_bound_or_linked_out_is_refused(tmp_path: Path, monkeypatch) -> None:
    run, outside = tmp_path / "run", tmp_path / "outside.json"
    run.mkdir()
    write_eval(tmp_path, _record())
    (tmp_path / filenames.EVAL_FILE).rename(outside)
    os.symlink(outside, run / filenames.EVAL_FILE)
    with pytest.raises(EvalUnreadable, match="leads out of"):
        read_eval(run)
    monkeypatch.setattr(evalrecord, "MAX_BYTES", 100)
    write_eval(tmp_path, _record())
    with pytest.raises(EvalUnreadable, match="larger than 100 bytes"):
        read_eval(tmp_path)


def test_the_writer_follows_no_link(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("keep", encoding="utf-8")
    os.symlink(target, tmp_path / filenames.EVAL_FILE)
    write_eval(tmp_path, _record())  # replaces the link's name, never writes through it
    assert target.read_text(encoding="utf-8") == "keep"
    assert read_eval(tmp_path) == _record()


def test_control_characters_of_a_record_never_reach_the_terminal(tmp_path: Path) -> None:
    data = _record(ok=False).to_json() | {"reason": "boom\x1b[2J"}
    (tmp_path / filenames.EVAL_FILE).write_text(json.dumps(data), encoding="utf-8")
    record = read_eval(tmp_path)
    assert record is not None and "\x1b" not in record.reason


def test_the_report_states_each_score_or_the_failure(tmp_path: Path) -> None:
    write_eval(tmp_path, _record())
    rows = dict(eval_rows(RunLog("run", output_dir=tmp_path)))
    assert rows["evaluation"].startswith("lm_eval 0.4.13 on /out, 3.5 s")
    assert rows["  arc_easy acc"] == "0.7500 ± 0.0200 (100 items, 0-shot)"
    assert summary(RunLog("run", output_dir=tmp_path), 0.2)["evaluation"]["scores"][0]["task"] == "arc_easy"
    write_eval(tmp_path, _record(ok=False))
    assert eval_rows(RunLog("run", output_dir=tmp_path)) == [
        ("evaluation", "failed (lm_eval 0.4.13 on /out, 3.5 s): OSError: no")
    ]
    assert eval_rows(RunLog("baseline")) == []  # no output directory: nothing to state


def test_compare_sets_two_runs_scores_side_by_side(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    write_eval(a, _record(value=0.75))
    write_eval(b, _record(value=0.5))
    rows = compare_scores(RunLog("a", output_dir=a), RunLog("b", output_dir=b))
    arc = next(r for r in rows if (r["task"], r["metric"]) == ("arc_easy", "acc"))
    assert (arc["a"], arc["b"], arc["difference"]) == (0.75, 0.5, -0.25)
    only_a = compare_scores(RunLog("a", output_dir=a), RunLog("c", output_dir=tmp_path / "c"))
    assert all(r["b"] is None and r["difference"] is None for r in only_a)
    doc = compare(RunLog("a", output_dir=a), RunLog("b", output_dir=b)).to_json()
    assert doc["benchmarks"] == rows
