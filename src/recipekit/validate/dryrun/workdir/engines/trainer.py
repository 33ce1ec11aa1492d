"""The Hugging Face Trainer's dry run (``engine=trainer``): what every dry run did before the engine seam.

Its pods run recipekit's own interpreter (the dev venv holds the Trainer's stack); its one explicit edit is ZeRO-3's
persistence threshold (else a tiny model partitions nothing); its checkpoints are the Trainer's ``checkpoint-N``
directories, chosen by the runtime contract's rule (:mod:`recipekit.runtime.boundary.resume.checkpointdirs`).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipekit.bundle.files import DS_CONFIG
from recipekit.runtime.boundary import filenames, recipeview
from recipekit.runtime.boundary.resume import checkpointdirs

if TYPE_CHECKING:
    from recipekit.bundle.engines.documents import EngineDocuments
    from recipekit.recipe.sections import Recipe
    from recipekit.validate.dryrun.options import DryRunOptions
    from recipekit.validate.dryrun.workdir.changes import Substituter, Substitution
    from recipekit.validate.shared.loader import Bundle
    from recipekit.validate.shared.results import Result


class TrainerDryRun:
    """``engine=trainer``: runtime/train.py under DeepSpeed, in recipekit's own interpreter."""

    kind = "trainer"
    entry_file = "runtime/train.py"
    operations = frozenset({"preflight", "metrics", "profile", "fault", "restart", "recovery"})
    records_rows = True

    def unrunnable(self, bundle: Bundle, progress: Callable[[str], None]) -> str | None:
        needed = ["torch", "transformers", "datasets", "tokenizers", "psutil"]
        if bundle.ds_config is not None:  # the bundle's own answer: it has a ds_config when it runs DeepSpeed
            needed.append("deepspeed")
        if bundle.recipe is not None and recipeview.trains_adapter(bundle.recipe.mode.kind):
            needed.append("peft")
        missing = [name for name in needed if importlib.util.find_spec(name) is None]
        return f"{', '.join(missing)} not installed here (pip install 'recipekit[train]')" if missing else None

    def layout(self, sub: Substituter, dry: Recipe, options: DryRunOptions) -> Recipe:
        return dry  # the Trainer's layouts (DP, ZeRO, AutoTP inside a pod) run as built

    def edit(self, engine: EngineDocuments, device: str) -> tuple[EngineDocuments, list[Substitution]]:
        ds_config, explicit = tiny_model_ds_config(engine.files.get(DS_CONFIG))
        if not explicit:
            return engine, []
        assert ds_config is not None
        return replace(engine, files={**engine.files, DS_CONFIG: ds_config}), explicit

    def pod_environment(self, options: DryRunOptions, env: dict[str, str]) -> dict[str, str]:
        return {}

    def checkpoints(self, output_dir: Path) -> list[int]:
        return sorted(step for step, _, problem in checkpointdirs.checkpoints(output_dir) if problem is None)

    def resume_step(self, output_dir: Path) -> int | None:
        path = checkpointdirs.latest_complete_checkpoint(output_dir)
        return checkpointdirs.checkpoint_step(path) if path is not None else None

    def final_step(self, output_dir: Path) -> int | None:
        """The Trainer's final ``global_step`` (trainer_state.json at the top of the output directory)."""
        try:
            state = json.loads((output_dir / filenames.TRAINER_STATE_FILE).read_text(encoding="utf-8"))
            return int(state["global_step"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def exports_weights(self, doc: dict[str, Any] | None) -> bool:
        return True

    def final_weights(self, output_dir: Path) -> list[str]:
        return [name for name in filenames.WEIGHT_FILES if (output_dir / name).is_file()]

    def not_proven(self, bundle: Bundle) -> list[str]:
        return []  # the Trainer's dry run says its limits in docs/validate.md, as it always has

    def own_checks(self, bundle: Bundle) -> list[Result]:
        return []  # the pods run the bundle's ZeRO stage and TP as built, at fewer ranks: DeepSpeed checks them there


def tiny_model_ds_config(ds: dict[str, Any] | None) -> tuple[dict[str, Any] | None, list[Substitution]]:
    """The ds_config a tiny twin needs: ZeRO-3 must partition its parameters, which are all below the persistence
    threshold a real model's bundle sets."""
    from recipekit.validate.dryrun.workdir.changes import Substitution

    zero = (ds or {}).get("zero_optimization") or {}
    if ds is None or zero.get("stage") != 3 or zero.get("stage3_param_persistence_threshold") == 0:
        return ds, []
    old = zero["stage3_param_persistence_threshold"]
    why = "else ZeRO-3 partitions no parameter of a tiny model"
    change = Substitution(DS_CONFIG, "zero_optimization.stage3_param_persistence_threshold", old, 0, why)
    return {**ds, "zero_optimization": {**zero, "stage3_param_persistence_threshold": 0}}, [change]
