"""A profiling window: ``train.profile_steps=[a, b]`` records a profiler trace of optimizer steps a..b.

torch's profiler on CUDA and CPU (a Chrome trace per rank: ``profile/steps-a-b/rank-R.pt.trace.json``, opened by
chrome://tracing, Perfetto or TensorBoard's profiler plugin); torch_npu's profiler on Ascend, whose own trace handler
writes the directory layout MindStudio Insight and TensorBoard read (``profile/steps-a-b/``). The window is short on
purpose: a trace grows by megabytes per step, and profiling slows the steps it covers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from ..boundary import filenames, metricslog
from ..boundary.common import LOG


def trace_dir(output_dir: Path, first: int, last: int) -> Path:
    return Path(output_dir) / filenames.PROFILE_DIR / f"steps-{first}-{last}"


class ProfilerCallback(TrainerCallback):
    """Starts the profiler as step ``first`` begins and stops it, writing the trace, when step ``last`` ends."""

    def __init__(self, steps: Any, output_dir: Path, rank: int, device_kind: str, records: Any):
        self.first, self.last = int(steps[0]), int(steps[1])
        self.dir, self.rank, self.kind, self.records = (
            trace_dir(output_dir, self.first, self.last),
            rank,
            device_kind,
            records,
        )
        self.profiler: Any = None
        self.written: Path | None = None

    def _start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.kind == "npu":
            import torch_npu

            activities = [torch_npu.profiler.ProfilerActivity.CPU, torch_npu.profiler.ProfilerActivity.NPU]
            self.profiler = torch_npu.profiler.profile(
                activities=activities,
                record_shapes=True,
                on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(str(self.dir)),
            )
        else:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.kind == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(activities=activities, record_shapes=True)
        self.profiler.start()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.profiler is None and self.written is None and state.global_step + 1 == self.first:
            self._start()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.profiler is None or state.global_step < self.last:
            return
        self.profiler.stop()
        if self.kind == "npu":
            self.written = self.dir  # torch_npu's handler wrote its directory on stop
        else:
            self.written = self.dir / f"rank-{self.rank}.pt.trace.json"
            self.profiler.export_chrome_trace(str(self.written))
        self.profiler = None
        LOG.info("profiler: steps %d-%d traced into %s", self.first, self.last, self.dir)
        self.records.add(metricslog.EVENT_PROFILE, steps=[self.first, self.last], path=str(self.dir))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.profiler is not None:  # training ended inside the window
            self.profiler.stop()
            self.profiler = None
