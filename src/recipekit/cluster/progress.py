"""How far a run has come, from what it writes on the shared volume: where the volume is mounted on this machine.

The reading is ``runs``' (``runlog.load_run``: metrics.jsonl under its bounds, typed records, attempts); this module
only picks the figures a status line needs — the last step and loss, the recent tokens/s per device and step time,
the ETA from the plan's total steps — and says why there are none when the volume is not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from recipekit.base import yamlfile
from recipekit.base.errors import RecipeError
from recipekit.runs.runlog import RunLog, load_run, on_volume
from recipekit.runs.runplan import steady

#: The steps the recent figures (tokens/s, step time) are the median of.
RECENT = 20


@dataclass(frozen=True)
class Progress:
    step: int | None
    total_steps: int | None
    loss: float | None
    tokens_per_s_per_device: float | None
    step_s: float | None
    starts: int  # train.py's starts, from metrics.jsonl (the Job's attempts that got as far as training)
    done: bool

    @property
    def eta_s(self) -> float | None:
        if self.done or self.step is None or not self.total_steps or self.step_s is None:
            return None
        return max(0, self.total_steps - self.step) * self.step_s


def of_run(run: RunLog, total_steps: int | None) -> Progress:
    """The figures of a run read by ``runs``."""
    losses = run.values("loss")
    tokens = run.values("tokens_per_second_per_device")[-RECENT:]
    steps = run.values("step_time_s")[-RECENT:]
    planned = ((run.plan or {}).get("time") or {}).get("total_steps")
    total = total_steps if total_steps else planned if isinstance(planned, int) else None
    return Progress(
        step=run.final_step,
        total_steps=total,
        loss=losses[-1] if losses else None,
        tokens_per_s_per_device=steady(tokens),
        step_s=steady(steps),
        starts=len(run.attempts),
        done=run.done is not None,
    )


def from_bundle(bundle: Path, volume: Path | None) -> tuple[Progress | None, str | None]:
    """The run of ``bundle`` (its output directory below ``volume`` when given), or why it cannot be read here."""
    try:
        return of_run(load_run(bundle, volume), None), None
    except RecipeError as err:
        return None, _not_here(str(err.problems[0]), volume)


def from_recipe(recipe_yaml: str, volume: Path | None) -> tuple[Progress | None, str | None]:
    """The run whose resolved recipe.yaml (the text the Job's ConfigMap holds) is ``recipe_yaml``."""
    try:
        resolved: Any = yamlfile.load(recipe_yaml, "recipe.yaml (the run files' ConfigMap)")
    except yaml.YAMLError as exc:  # a ConfigMap is anyone's with edit rights in the namespace: read as untrusted
        return None, f"recipe.yaml in the run files' ConfigMap cannot be read: {yamlfile.one_line(exc)}"
    resolved = resolved if isinstance(resolved, dict) else {}
    output = (resolved.get("training_arguments") or {}).get("output_dir")
    mount = ((resolved.get("recipe") or {}).get("cluster") or {}).get("mount_path") or "/"
    total = (resolved.get("plan") or {}).get("total_steps")
    if not isinstance(output, str) or not output:
        return None, "the run files name no output directory"
    path = on_volume(output, str(mount), volume)
    try:
        return of_run(load_run(path), total if isinstance(total, int) else None), None
    except RecipeError as err:
        return None, _not_here(str(err.problems[0]), volume)


def _not_here(problem: str, volume: Path | None) -> str:
    if volume is None:
        return f"{problem}; --volume DIR: where the shared volume is mounted here"
    return problem
