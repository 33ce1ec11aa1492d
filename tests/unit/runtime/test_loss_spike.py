"""A loss spike names the rank and the batch (runtime/ops/lossguard.py): the guard's one all-reduce per step tells
every rank each rank's loss, and at the loss-spike alert (alerts.py ``loss_jump``) each rank writes its batches'
fingerprints and rank 0 the ranks' losses, highest first. The dry run's drill (ops.testing.spike_at_step) is
tests/integration/test_dryrun_ops.py's."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch

from recipekit.runtime.boundary import filenames
from recipekit.runtime.ops.alerts import LOSS_SPIKE_ALERT, Alerts, Health
from recipekit.runtime.ops.lossguard import MAX_SPIKE_REPORTS, LossGuard, StepLosses, spike_report


def _step(guard: LossGuard, step: int, losses: list[float], tokens: int = 4) -> list[int]:
    for i, loss in enumerate(losses):
        ids = torch.arange(tokens, dtype=torch.long).reshape(1, tokens) + 100 * step + i
        guard.observe(torch.tensor(loss), {"input_ids": ids, "labels": ids})
    ranks = guard.agree(torch.device("cpu"), step)
    guard.reset()
    return ranks


def test_the_window_keeps_each_step_s_loss_and_token_ids_for_the_logging_interval() -> None:
    guard = LossGuard()
    guard.keep_steps(2)
    for step in (1, 2, 3):
        assert _step(guard, step, [0.5, 0.25]) == []  # no rank saw a non-finite loss
    assert [s.step for s in guard.window] == [2, 3]
    last = guard.window[-1]
    assert last.losses == [0.75] and last.tokens == [8] and len(last.batches) == 2  # one rank: its sum, its labels
    assert torch.equal(last.batches[1], torch.arange(4).reshape(1, 4) + 301)
    assert _step(guard, 4, [float("nan")]) == [0]  # the non-finite verdict is unchanged


def test_the_highest_loss_per_token_comes_first_and_a_rank_without_one_is_left_out() -> None:
    step = StepLosses(5, [2.0, None, 9.5, float("nan")], [100, None, 1000, 10], [])
    assert step.per_token()[:3] == [0.02, None, 0.0095] and math.isnan(step.per_token()[3])
    assert step.highest() == [3, 0, 2]  # NaN above every number; rank 1 (an earlier pipeline stage) has none
    assert StepLosses(5, [2.0, 9.5], [None, None], []).highest() == [1, 0]  # tokens unknown: the loss itself


def test_the_report_holds_every_rank_s_losses_and_this_rank_s_batch_fingerprints(tmp_path: Path) -> None:
    guard = LossGuard()
    _step(guard, 7, [1.0, 2.0])
    where = spike_report(guard, 7, "loss rose 900%", tmp_path, rank=0)
    assert where == tmp_path / f"{filenames.LOSS_SPIKE_PREFIX}7"
    report = json.loads((where / "report.json").read_text())
    assert report["step"] == 7
    assert report["steps"] == [{"step": 7, "losses": [3.0], "tokens": [8], "highest_ranks": [0]}]
    batches = json.loads((where / "batches-rank-0.json").read_text())
    ids = (torch.arange(4, dtype=torch.long).reshape(1, 4) + 701).numpy().tobytes()
    assert batches["7"][1] == {"sha256": hashlib.sha256(ids).hexdigest(), "tokens": 4}
    assert spike_report(guard, 7, "again", tmp_path, rank=1) == where  # another rank: its batches only
    assert (where / "batches-rank-1.json").is_file()


def test_a_noisy_run_writes_a_bounded_number_of_reports(tmp_path: Path) -> None:
    guard = LossGuard()
    _step(guard, 1, [1.0])
    written = [spike_report(guard, step, "spike", tmp_path, rank=0) for step in range(MAX_SPIKE_REPORTS + 5)]
    assert sum(w is not None for w in written) == MAX_SPIKE_REPORTS


def test_a_link_planted_where_the_report_goes_is_refused_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A volume writer's link at ``loss-spike-step-N`` (or a file in its place) gets no write through it, and the
    refusal is a warning, not an exception out of the training step: the report is what the alert adds, not what
    the run needs."""
    guard = LossGuard()
    _step(guard, 7, [1.0, 2.0])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / f"{filenames.LOSS_SPIKE_PREFIX}7").symlink_to(elsewhere, target_is_directory=True)
    (out / f"{filenames.LOSS_SPIKE_PREFIX}8").write_text("a file, not a directory")
    with caplog.at_level("WARNING"):
        assert spike_report(guard, 7, "loss rose 900%", out, rank=0) is None
        assert spike_report(guard, 8, "loss rose 900%", out, rank=0) is None
    assert list(elsewhere.iterdir()) == []
    assert (out / f"{filenames.LOSS_SPIKE_PREFIX}8").read_text() == "a file, not a directory"
    assert sum("its report was not written" in r.getMessage() for r in caplog.records) == 2


def test_the_spike_record_names_the_rank_when_its_report_was_refused(tmp_path: Path) -> None:
    """The record in metrics.jsonl still names each rank's loss and the highest, with no report to point at."""
    from recipekit.runtime.ops.engineops import EngineOps

    ops = object.__new__(EngineOps)
    ops.guard, ops.output_dir, ops.rank = LossGuard(), tmp_path, 0
    _step(ops.guard, 7, [1.0, 2.0])
    (tmp_path / f"{filenames.LOSS_SPIKE_PREFIX}7").symlink_to(tmp_path, target_is_directory=True)
    records = _Records()
    ops.loss_spike(7, "loss rose 900%", records)
    ((kind, fields),) = records.added
    assert fields["report"] is None and fields["highest_rank"] == 0 and fields["losses"] == [3.0]


class _Records:
    def __init__(self) -> None:
        self.added: list[tuple[str, dict]] = []

    def add(self, kind: str, **fields: object) -> None:
        self.added.append((kind, fields))


class _Exporter:
    def set(self, *args: object) -> None: ...

    def alert(self, name: str) -> None: ...


class _Thresholds:
    loss_spike_ratio, grad_norm_jump_ratio, mfu_target, mfu_low_steps = 0.3, 0.3, 0.0, 20


@pytest.mark.parametrize("second, fires", [(1.2, False), (1.4, True)])
def test_the_loss_spike_alert_and_only_it_calls_the_spike_hook(second: float, fires: bool) -> None:
    health = Health(Alerts(_Thresholds()), _Exporter(), _Records(), "cpu")
    called: list[tuple[int, str]] = []
    health.on_loss_spike = lambda step, message: called.append((step, message))
    health.logged(1, {"loss": 1.0, "grad_norm": 1.0})
    health.logged(2, {"loss": second, "grad_norm": 10.0})  # the grad norm's jump is another alert
    assert [step for step, _ in called] == ([2] if fires else [])
    alerts = [fields["alert"] for _, fields in health.records.added]
    assert (LOSS_SPIKE_ALERT in alerts) is fires and "grad_norm_jump" in alerts
