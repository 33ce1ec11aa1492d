"""The dry run's options (the ``validate --dry-run`` flags) and the error for options it cannot use.

A leaf of the dry run: the work copy, the simulated pods and the dry run itself all take these options, so they live
apart from each of them. Each field's metadata (:class:`Flag`) is the one home of its flag: default, range, choices
and help; ``recipekit validate`` generates its click options from it (cli/validate.py), as torchx's ``runopts``
describes a scheduler's options once for every front end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from recipekit.runtime.boundary.recipeview import DEVICE_TARGETS as TARGETS
from recipekit.runtime.volume.restart import choice as restart_choice

#: The prefix of the op build's progress messages: one line a terminal rewrites, never a line of its own.
BUILD_PROGRESS = "building DeepSpeed's C++ ops:"


class DryRunUsageError(Exception):
    """Arguments or a work directory the dry run cannot use (exit code 2)."""


@dataclass(frozen=True)
class Flag:
    """How an option is given on the command line: its help, and the range or choices a value must be in."""

    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()

    def problem(self, name: str, value: Any) -> str | None:
        """Why ``value`` is not allowed for flag ``--name``, or None."""
        if value is None:
            return None
        if self.choices and value not in self.choices:
            return f"--{name} {value}: one of {', '.join(self.choices)}"
        if isinstance(value, float) and math.isnan(value):
            return f"--{name}: nan is not a number"
        low, high = self.low, self.high
        if low is not None and high is not None and not low <= value <= high:
            return f"--{name} {value}: must be between {low:g} and {high:g}"
        return None


def _flag(default: Any, help: str, **limits: Any) -> Any:
    return field(default=default, metadata={"flag": Flag(help, **limits)})


@dataclass(frozen=True)
class DryRunOptions:
    """What a dry run is asked to do; :meth:`resolved` checks it and fills in what follows from it, once."""

    pods: int = _flag(2, "Simulated pods (--procs-per-pod each).", low=1, high=16)
    procs_per_pod: int = _flag(
        1, "Training processes (devices) per simulated pod, e.g. 2 pods of 2 for TP 2 × DP 2.", low=1, high=8
    )
    steps: int = _flag(8, "Optimizer steps of the dry run (checkpoint at half).", low=2, high=10_000)
    kill_pod: int | None = _flag(
        None,
        "Kill this pod (its whole process tree) during the run, restart all pods as Volcano's RestartJob does, "
        "check resume.",
    )
    at_step: int | None = _flag(
        None, "Training step at which --kill-pod strikes (default: between the midway checkpoint and the end)."
    )
    resume_pods: int | None = _flag(
        None,
        "After --kill-pod, continue on this many pods (a node lost for good): the work copy is rebuilt at the same "
        "global batch as `recipekit rescale` does, and the resume is checked row by row.",
        low=1,
        high=16,
    )
    lose_pod: int | None = _flag(
        None,
        "Lose this pod's node for good at --at-step (its whole process tree killed; its replacement stays Pending): "
        "an elastic bundle (cluster.min_nodes) must go on on the pods that are left with nobody acting, at the same "
        "global batch, and resume exactly.",
    )
    return_at_step: int | None = _flag(
        None, "After --lose-pod, capacity returns at this step: the pod starts again and the run grows back."
    )
    restart: str | None = _flag(
        None,
        "After the run completes, restart it as `recipekit restart` does, from one of its checkpoints or fresh "
        "(checkpoint-N or fresh; several, comma-separated, one after another: checkpoint-4,fresh); each restart "
        "must complete and be recorded in the run's history.",
    )
    device: str = _flag(
        "cpu",
        "Run on real devices (--procs-per-pod per pod) instead of CPU; refused (exit 2) where there are too few.",
        choices=("cpu", *(t for t in TARGETS if t != "cpu")),
    )
    workdir: Path | None = _flag(
        None,
        "Work directory for the dry run (default: a new one per dry run, <bundle>/../.dryrun/<name>/<run id>-<time>, "
        "the newest 5 of a bundle kept; `recipekit clean` removes them); logs and the report stay there.",
    )
    timeout: float = _flag(900.0, "Seconds the whole dry run may take; pods are killed past it.", low=10, high=86400)
    grace: float = 20.0  # SIGTERM → SIGKILL when Volcano deletes the surviving pods (not a flag)

    @property
    def save_steps(self) -> int:
        return max(1, self.steps // 2)

    @property
    def default_at_step(self) -> int:
        """Where --kill-pod strikes without --at-step: between the midway checkpoint and the end."""
        return min(self.steps - 1, self.save_steps + max(1, self.steps // 4))

    def restarts(self) -> list[str | None]:
        """``--restart`` as the checkpoints to restart from, in order (None: fresh); DryRunUsageError for one that is
        not a checkpoint this dry run saves."""
        found: list[str | None] = []
        for item in (self.restart or "").split(","):
            try:
                wanted = restart_choice(item.strip())
            except ValueError as exc:
                raise DryRunUsageError(f"--restart {exc}") from None
            step = int(wanted.split("-")[1]) if wanted else 0
            if wanted and (step > self.steps or step % self.save_steps):
                saved = ", ".join(f"checkpoint-{s}" for s in range(self.save_steps, self.steps + 1, self.save_steps))
                raise DryRunUsageError(f"--restart {wanted}: the dry run saves {saved}")
            found.append(wanted)
        return found

    def check(self) -> None:
        """Raise DryRunUsageError for flags out of range or contradicting each other (nothing is changed)."""
        self.resolved()

    def resolved(self) -> DryRunOptions:
        """These options with --at-step filled in when --kill-pod is given without it; DryRunUsageError for flags
        out of range or contradicting each other. Resolving resolved options returns them unchanged."""
        for option in flags():
            problem = option.metadata["flag"].problem(flag_name(option.name), getattr(self, option.name))
            if problem:
                raise DryRunUsageError(problem)
        if self.lose_pod is not None:
            return self._lost()
        if self.return_at_step is not None:
            raise DryRunUsageError("--return-at-step needs --lose-pod")
        if self.at_step is not None and self.kill_pod is None:
            raise DryRunUsageError("--at-step needs --kill-pod or --lose-pod")
        if self.resume_pods is not None and self.kill_pod is None:
            raise DryRunUsageError("--resume-pods needs --kill-pod")
        if self.restart is not None:
            self.restarts()  # each one checked
            if self.kill_pod is not None:
                raise DryRunUsageError("--restart and --kill-pod: one of them per dry run")
        if self.kill_pod is None:
            return self
        if not 0 <= self.kill_pod < self.pods:
            raise DryRunUsageError(f"--kill-pod {self.kill_pod}: pods are numbered 0..{self.pods - 1}")
        at_step = self.default_at_step if self.at_step is None else self.at_step
        if not 1 <= at_step < self.steps:
            raise DryRunUsageError(f"--at-step {at_step}: must be between 1 and --steps - 1 ({self.steps - 1})")
        if self.resume_pods == self.pods:
            raise DryRunUsageError(
                f"--resume-pods {self.resume_pods}: not --pods ({self.pods}), the pods the run starts on"
            )
        return self if at_step == self.at_step else replace(self, at_step=at_step)

    def _lost(self) -> DryRunOptions:
        """--lose-pod's options resolved: any pod of the Job (an elastic Job's rendezvous store lives in a pod of
        its own, bundle/documents.py), the step it goes at, and the step its capacity returns at, after that one."""
        assert self.lose_pod is not None
        others = [("--kill-pod", self.kill_pod), ("--resume-pods", self.resume_pods), ("--restart", self.restart)]
        given = [name for name, value in others if value is not None]
        if given:
            raise DryRunUsageError(f"--lose-pod and {', '.join(given)}: one drill per dry run")
        if not 0 <= self.lose_pod < self.pods:
            raise DryRunUsageError(f"--lose-pod {self.lose_pod}: pods 0..{self.pods - 1}")
        at_step = self.default_at_step if self.at_step is None else self.at_step
        if not 1 <= at_step < self.steps:
            raise DryRunUsageError(f"--at-step {at_step}: must be between 1 and --steps - 1 ({self.steps - 1})")
        back = self.return_at_step
        if back is not None and not at_step < back < self.steps - 1:
            # the shrunk workers stopped by the agents finish the step after it and save it: the grown run must
            # have a step left to train
            raise DryRunUsageError(
                f"--return-at-step {back}: after --at-step ({at_step}) and at most --steps - 2 ({self.steps - 2})"
            )
        return self if at_step == self.at_step else replace(self, at_step=at_step)


def flags() -> list[Any]:
    """The fields of :class:`DryRunOptions` that are command-line flags, in their order."""
    return [f for f in fields(DryRunOptions) if "flag" in f.metadata]


def flag_name(name: str) -> str:
    """The flag of field ``name`` without its dashes (``procs_per_pod`` → ``procs-per-pod``)."""
    return name.replace("_", "-")
