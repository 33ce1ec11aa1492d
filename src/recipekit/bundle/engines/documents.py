"""What one engine's entrypoint reads besides the documents every bundle shares (the Job, launch.json, recipe.yaml's
recipe, plan and operations): one record, whatever the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EngineDocuments:
    """One engine's part of a bundle, as data the renderer only serialises."""

    #: The runtime module torchrun starts in each process (launch.json's ``module``).
    module: str
    #: recipe.yaml's sections for the entrypoint, after ``plan`` (the Trainer's ``training_arguments``).
    recipe_sections: dict[str, Any]
    #: JSON files of the bundle by name (the Trainer's ds_config.json under DeepSpeed).
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Variables the engine's libraries read (DeepSpeed's accelerator); a key the pod spec sets keeps its value.
    env: dict[str, str] = field(default_factory=dict)
