"""A tracker that is down never stops training (runtime/ops/trackers/guarded.py).

The guard is shown on the real Trainer: MLflow's own integration pointed at a port nothing listens on (its client
raises when it cannot reach the server), and stand-ins for a tracker whose call raises, one whose call blocks, and one
that keeps thread-local state (as MLflow's active run does). Each run trains to its last step; the failing tracker
is turned off once, with an alert that names it.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from recipekit.runtime.ops.trackers import guarded as trackers

STEPS = 3


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {"loss": ((x * self.weight).sum(-1) - 1.0).pow(2).mean()}


class _Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.full((4,), float(i % 3)), "labels": torch.tensor(0.0)}


def _trainer(tmp_path: Path, report_to: str | list[str], *callbacks: Any) -> Trainer:
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        report_to=report_to,
        per_device_train_batch_size=2,
        max_steps=STEPS,
        logging_steps=1,
        save_strategy="no",
        remove_unused_columns=False,
        dataloader_num_workers=0,
    )
    return Trainer(model=_Model(), args=args, train_dataset=_Data(), callbacks=list(callbacks))


class _Raises(TrainerCallback):
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        raise ConnectionError("tracker.example.com: 503 Service Unavailable")


class _Blocks(TrainerCallback):
    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(30)


class _ThreadBound(TrainerCallback):
    def __init__(self) -> None:
        self.threads: set[int] = set()
        self.logs = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.threads.add(threading.get_ident())

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.threads.add(threading.get_ident())
        self.logs += 1


def _guard(trainer: Trainer, inner: TrainerCallback, deadline: float, alerts: list[str]) -> trackers.GuardedTracker:
    callbacks = trainer.callback_handler.callbacks
    index = callbacks.index(inner)
    guard = trackers.GuardedTracker(inner, "wandb", deadline, lambda name, message: alerts.append(message))
    callbacks[index] = guard
    return guard


def test_a_tracker_that_raises_is_turned_off_and_training_goes_on(tmp_path: Path) -> None:
    inner, alerts = _Raises(), []
    trainer = _trainer(tmp_path, "none", inner)
    guard = _guard(trainer, inner, 5, alerts)
    trainer.train()
    assert trainer.state.global_step == STEPS
    assert guard.off is not None and "503" in guard.off
    assert len(alerts) == 1 and "wandb failed in on_train_begin" in alerts[0] and "off for this run" in alerts[0]


def test_a_tracker_that_blocks_is_left_behind_after_its_deadline(tmp_path: Path) -> None:
    inner, alerts = _Blocks(), []
    trainer = _trainer(tmp_path, "none", inner)
    _guard(trainer, inner, 0.5, alerts)
    started = time.monotonic()
    trainer.train()
    assert trainer.state.global_step == STEPS
    assert time.monotonic() - started < 20, "the blocked call held training"
    assert len(alerts) == 1 and "no answer within 0.5 s" in alerts[0]


def test_every_call_of_a_tracker_runs_on_its_one_thread(tmp_path: Path) -> None:
    inner, alerts = _ThreadBound(), []
    trainer = _trainer(tmp_path, "none", inner)
    _guard(trainer, inner, 5, alerts)
    trainer.train()
    assert inner.logs >= STEPS and len(inner.threads) == 1 and threading.get_ident() not in inner.threads
    assert alerts == []


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow not installed (recipekit[train])")
def test_mlflow_with_its_server_down_does_not_stop_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # the discard port: nothing answers
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "tiny")
    trainer = _trainer(tmp_path, ["mlflow"])
    alerts: list[str] = []
    guards = trackers.guard_trackers(trainer.callback_handler.callbacks, 10, lambda name, m: alerts.append(m))
    assert [g.tracker for g in guards] == ["mlflow"]
    trainer.train()
    trackers.finish(guards)
    assert trainer.state.global_step == STEPS
    assert len(alerts) == 1 and alerts[0].startswith("mlflow failed in on_train_begin")


def test_a_missing_client_is_dropped_from_report_to_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "swanlab" else real(name, *a))
    kept, notes = trackers.importable(["tensorboard", "swanlab"])
    assert kept == ["tensorboard"] and len(notes) == 1 and "swanlab" in notes[0]
    assert trackers.importable(["swanlab"]) == ("none", notes)
    assert trackers.importable("none") == ("none", [])


def test_the_deadline_stays_inside_the_watchdogs_startup_timeout() -> None:
    assert trackers.deadline_s(120) == 30 and trackers.deadline_s(3600) == 60 and trackers.deadline_s(4) == 5
