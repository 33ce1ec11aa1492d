"""Measured memory in metrics.jsonl: each logged step's device peak (torch's counter, reset per log) and peak RSS."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from recipekit.runtime.boundary import metricslog  # noqa: E402
from recipekit.runtime.session.callbacks import GIB, PeakMemoryCallback, peak_rss_bytes  # noqa: E402

ARGS = SimpleNamespace(device=torch.device("cpu"))


def test_a_cpu_run_logs_its_peak_rss_and_no_device_memory() -> None:
    logs = {"loss": 1.0}
    PeakMemoryCallback("cpu").on_log(ARGS, None, None, logs=logs)
    assert metricslog.PEAK_DEVICE_MEMORY_KEY not in logs
    rss = logs[metricslog.PEAK_HOST_MEMORY_KEY]
    assert 0 < rss <= peak_rss_bytes() / GIB + 1e-3  # this process: a test runner holds tens of MiB at least
    assert rss > 10 / 1024  # more than 10 MiB: an interpreter with torch imported


def test_logs_without_a_loss_are_left_alone() -> None:
    logs = {"eval_loss": 1.0}
    PeakMemoryCallback("cpu").on_log(ARGS, None, None, logs=logs)
    assert logs == {"eval_loss": 1.0}


def test_the_device_peak_is_read_through_torchs_counter_and_reset_each_log(monkeypatch: pytest.MonkeyPatch) -> None:
    peaks = [3 * GIB, GIB // 2]
    resets: list[int] = []
    fake = SimpleNamespace(
        is_available=lambda: True,
        max_memory_allocated=lambda: peaks[len(resets)],
        reset_peak_memory_stats=lambda: resets.append(1),
    )
    monkeypatch.setattr(torch, "cuda", fake)
    callback = PeakMemoryCallback("cuda")
    first, second = {"loss": 1.0}, {"loss": 0.9}
    callback.on_log(ARGS, None, None, logs=first)
    callback.on_log(ARGS, None, None, logs=second)
    assert first[metricslog.PEAK_DEVICE_MEMORY_KEY] == 3.0
    assert second[metricslog.PEAK_DEVICE_MEMORY_KEY] == 0.5  # the peak since the last log, not of the whole run
    assert len(resets) == 2
