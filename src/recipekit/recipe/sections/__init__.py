"""The typed Recipe: what a user may say, and nothing else — one module per section.

Every section is a closed record (:class:`~recipekit.recipe.schema.Section`) so a misspelled key is an error rather than
a silently ignored setting. Each field carries a description: it is the documentation ``recipekit show`` and the recipes
README point to. Sections only check what one section can know on its own (types, ranges, enums); rules that need two
sections (global batch divisibility, precision against hardware, devices per pod) live in :mod:`recipekit.plan`, where
the arithmetic is, so the error can show it. The names the other stages use are imported here.
"""

from recipekit.recipe.sections.cluster import ClusterSpec, MindClusterSpec
from recipekit.recipe.sections.data import DataSpec
from recipekit.recipe.sections.engine import EngineSpec, MegatronEngine, TrainerEngine
from recipekit.recipe.sections.evaluation import HARNESS, EvalSpec
from recipekit.recipe.sections.hardware import HardwareSpec
from recipekit.recipe.sections.mode import (
    LoraMode,
    LoraSpec,
    ModeSpec,
    PretrainMode,
    QloraMode,
    QuantSpec,
    SftMode,
    adapter_of,
)
from recipekit.recipe.sections.model import (
    MAX_COUNT,
    MAX_DIM,
    ActivationsSpec,
    FlopsSpec,
    LayerModulesSpec,
    ModelSpec,
    ModuleTreeSpec,
    ParamCountsSpec,
)
from recipekit.recipe.sections.ops import OpsSpec, OpsTestingSpec
from recipekit.recipe.sections.parallel import ParallelSpec
from recipekit.recipe.sections.recipe import Recipe, parse_recipe
from recipekit.recipe.sections.train import TRACKERS, TrackingSpec, TrainSpec

__all__ = [
    "ActivationsSpec",
    "ClusterSpec",
    "DataSpec",
    "EngineSpec",
    "EvalSpec",
    "FlopsSpec",
    "HARNESS",
    "HardwareSpec",
    "LayerModulesSpec",
    "LoraMode",
    "LoraSpec",
    "MegatronEngine",
    "MAX_COUNT",
    "MAX_DIM",
    "MindClusterSpec",
    "ModeSpec",
    "ModelSpec",
    "ModuleTreeSpec",
    "OpsSpec",
    "OpsTestingSpec",
    "ParallelSpec",
    "ParamCountsSpec",
    "PretrainMode",
    "QloraMode",
    "QuantSpec",
    "Recipe",
    "SftMode",
    "TRACKERS",
    "TrackingSpec",
    "TrainSpec",
    "TrainerEngine",
    "adapter_of",
    "parse_recipe",
]
