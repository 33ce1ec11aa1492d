"""The dry run's side of the training-engine seam: what a dry run does differently for each engine, asked by the
engine the bundle was built for.

One class per engine, as in :mod:`recipekit.plan.engines` and :mod:`recipekit.bundle.engines`: the recipe
substitutions a layout needs on a laptop (the Megatron engine's layout scaled to a few gloo processes), the explicit
edits of the engine's own document for this machine (ZeRO-3's persistence threshold; Megatron's CPU settings), what
the pods need besides Volcano's variables (the engine's own interpreter, the CPU redirect), where the engine's room
leaves its checkpoints and final weights for the judges, and what a CPU run of it cannot prove. The dry run's stages
ask their engine through :func:`dryrun_engine` and never test an engine's name themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from recipekit.validate.dryrun.workdir.engines.megatron import MegatronDryRun
from recipekit.validate.dryrun.workdir.engines.trainer import TrainerDryRun

if TYPE_CHECKING:
    from recipekit.bundle.engines.documents import EngineDocuments
    from recipekit.recipe.sections import Recipe
    from recipekit.validate.dryrun.options import DryRunOptions
    from recipekit.validate.dryrun.workdir.changes import Substituter, Substitution
    from recipekit.validate.shared.loader import Bundle
    from recipekit.validate.shared.results import Result


class DryRunEngine(Protocol):
    """What the dry run asks of a training engine."""

    kind: str
    #: The runtime's module whose presence in the bundle says it is one of this engine's (recipe.yaml's start).
    entry_file: str
    #: The operations layer's parts its room runs, each judged by the dry run: preflight, metrics, profile, fault,
    #: restart (`recipekit restart` requests), recovery (the run directory's recovery.jsonl and its MTTR).
    operations: frozenset[str]
    #: Whether its pods write the row ledger (``ops.testing.record_rows``) a resume is checked against row by row.
    records_rows: bool

    def unrunnable(self, bundle: Bundle, progress: Callable[[str], None]) -> str | None:
        """Why this machine cannot run the engine's pods (a missing library, its venv not buildable), or None."""
        ...

    def layout(self, sub: Substituter, dry: Recipe, options: DryRunOptions) -> Recipe:
        """``dry`` with the engine's layout scaled to the simulated pods (each change recorded in ``sub``)."""
        ...

    def edit(self, engine: EngineDocuments, device: str) -> tuple[EngineDocuments, list[Substitution]]:
        """The engine's documents with this machine's explicit edits, and each edit with its reason."""
        ...

    def pod_environment(self, options: DryRunOptions, env: dict[str, str]) -> dict[str, str]:
        """What each pod's environment ``env`` (Volcano's variables and the laptop's settings) gets on top."""
        ...

    def checkpoints(self, output_dir: Path) -> list[int]:
        """Steps of the checkpoints a restart may resume from, oldest first (the room's own rule)."""
        ...

    def resume_step(self, output_dir: Path) -> int | None:
        """The step a restarted run (``--resume auto``) must continue from; None: from scratch."""
        ...

    def final_step(self, output_dir: Path) -> int | None:
        """The step the finished run's own state file says it reached."""
        ...

    def exports_weights(self, doc: dict[str, Any] | None) -> bool:
        """Whether a bundle with recipe.yaml ``doc`` writes final weights the judges must find."""
        ...

    def final_weights(self, output_dir: Path) -> list[str]:
        """The final model's weight files the finished run wrote."""
        ...

    def not_proven(self, bundle: Bundle) -> list[str]:
        """What a CPU dry run of this engine's bundle does not prove (validate's report lists it)."""
        ...

    def own_checks(self, bundle: Bundle) -> list[Result]:
        """The engine's own checks of the bundle as built (before the dry run scales it), where its code can be
        asked here: Megatron-core's argument validation of the layout. None for an engine the dry run runs whole."""
        ...


#: Every engine, by the name a recipe gives it (:data:`recipekit.plan.engines.ENGINES` has the same keys).
ENGINES: dict[str, DryRunEngine] = {engine.kind: engine for engine in (TrainerDryRun(), MegatronDryRun())}


def dryrun_engine(kind: str | None) -> DryRunEngine:
    """The engine a bundle of ``kind`` runs (the Trainer for a bundle from before the seam)."""
    return ENGINES.get(kind or "trainer", ENGINES["trainer"])


def engine_of_doc(doc: dict[str, Any] | None) -> DryRunEngine:
    """The engine of a bundle's recipe.yaml: its ``recipe.engine.kind``."""
    recipe = (doc or {}).get("recipe")
    engine = recipe.get("engine") if isinstance(recipe, dict) else None
    kind = engine.get("kind") if isinstance(engine, dict) else None
    return dryrun_engine(kind if isinstance(kind, str) else None)
