"""recipe.yaml: the resolved recipe, the plan's numbers and the Trainer arguments the bundle was built with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from .common import RunError
from .contract import RunPlan, plan_keys

#: Keys the runtime reads beyond the sections themselves: a recipe.yaml from another recipekit version may lack them,
#: and saying so at once beats an AttributeError halfway through a run.
REQUIRED_KEYS = (
    "recipe.name",
    "recipe.hw.torch_device",
    "recipe.hw.ds_accelerator",
    "recipe.data.shard_mib",
    "recipe.data.max_bad_records",
    "recipe.data.fingerprint",
    *plan_keys(),
)


@dataclass(frozen=True)
class RunConfig:
    """recipe.yaml, split into the parts the runtime uses. ``recipe`` allows attribute access; ``plan`` is typed."""

    recipe: Any
    plan: RunPlan
    training_arguments: dict[str, Any]
    bundle_dir: Path
    #: recipe.yaml's ``operations`` (preflight, watchdog, metrics, alerts, testing); None in an older bundle's
    operations: Any = None


def _namespace(value: Any) -> Any:
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _namespace(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_namespace(v) for v in value]
    return value


def _lookup(raw: dict[str, Any], dotted: str) -> bool:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def load_run_config(path: Path) -> RunConfig:
    """Read the bundle's recipe.yaml; a missing or foreign file is a one-line RunError."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RunError(f"cannot read recipe {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise RunError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
    except ValueError as exc:  # UnicodeDecodeError
        raise RunError(f"{path} is not UTF-8 text ({exc.__class__.__name__})") from None
    except RecursionError:
        raise RunError(f"{path} is nested too deeply to be a recipe") from None
    raw = raw if isinstance(raw, dict) else {}
    missing = [key for key in ("recipe", "plan", "training_arguments") if not isinstance(raw.get(key), dict)]
    if missing:
        raise RunError(f"{path} lacks section(s) {', '.join(missing)}: rebuild the bundle with `recipekit build`")
    absent = [key for key in REQUIRED_KEYS if not _lookup(raw, key)]
    if absent:
        raise RunError(f"{path} lacks {', '.join(absent)}: rebuild the bundle with this recipekit's `recipekit build`")
    operations = raw.get("operations")
    return RunConfig(
        _namespace(raw["recipe"]),
        RunPlan.from_dict(raw["plan"]),
        dict(raw["training_arguments"]),
        path.resolve().parent,
        _namespace(operations) if isinstance(operations, dict) else None,
    )
