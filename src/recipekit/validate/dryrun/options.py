"""The dry run's options (the ``validate --dry-run`` flags) and the error for options it cannot use.

A leaf of the dry run: the work copy, the simulated pods and the dry run itself all take these options, so they live
apart from each of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from recipekit.runtime.boundary.recipeview import DEVICE_TARGETS as TARGETS


class DryRunUsageError(Exception):
    """Arguments or a work directory the dry run cannot use (exit code 2)."""


@dataclass
class DryRunOptions:
    pods: int = 2
    procs_per_pod: int = 1  # training processes (devices) per simulated pod
    steps: int = 8
    kill_pod: int | None = None
    at_step: int | None = None
    #: after the kill, the Job continues on this many pods (a node lost for good), rebuilt at the same global batch
    resume_pods: int | None = None
    device: str = "cpu"  # cpu | npu | cuda
    workdir: Path | None = None
    timeout: float = 900.0  # the whole dry run, seconds
    grace: float = 20.0  # SIGTERM → SIGKILL when Volcano deletes the surviving pods

    @property
    def save_steps(self) -> int:
        return max(1, self.steps // 2)

    def check(self) -> None:
        """Raise DryRunUsageError for flags that contradict each other."""
        if self.pods < 1:
            raise DryRunUsageError(f"--pods must be at least 1 (got {self.pods})")
        if self.procs_per_pod < 1:
            raise DryRunUsageError(f"--procs-per-pod must be at least 1 (got {self.procs_per_pod})")
        if self.steps < 2:
            raise DryRunUsageError(f"--steps must be at least 2 (got {self.steps})")
        if self.at_step is not None and self.kill_pod is None:
            raise DryRunUsageError("--at-step needs --kill-pod")
        if self.kill_pod is not None:
            if not 0 <= self.kill_pod < self.pods:
                raise DryRunUsageError(f"--kill-pod {self.kill_pod}: pods are numbered 0..{self.pods - 1}")
            if self.at_step is None:
                self.at_step = min(self.steps - 1, self.save_steps + max(1, self.steps // 4))
            if not 1 <= self.at_step < self.steps:
                raise DryRunUsageError(
                    f"--at-step {self.at_step}: must be between 1 and --steps - 1 ({self.steps - 1})"
                )
        if self.resume_pods is not None:
            if self.kill_pod is None:
                raise DryRunUsageError("--resume-pods needs --kill-pod")
            if not 1 <= self.resume_pods or self.resume_pods == self.pods:
                raise DryRunUsageError(
                    f"--resume-pods {self.resume_pods}: at least 1 and not --pods ({self.pods}), the pods the run "
                    "starts on"
                )
        if self.device not in TARGETS:
            raise DryRunUsageError(f"--device {self.device}: one of {', '.join(TARGETS)}")
