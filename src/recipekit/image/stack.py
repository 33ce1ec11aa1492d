"""The software stack an image holds, and the digest that names it: one image per stack, not per recipe.

The image holds the base, the pinned packages and recipekit's runtime, nothing of a run: each run's own files travel
beside it in the bundle's ConfigMap (bundle/runfiles.py). Its tag is a digest of exactly what the Dockerfile builds
from: the image family's row of the matrix, the recipe's build-arg defaults and system packages
(:func:`~recipekit.image.matrix.dockerfile_values`), the pinned requirements
(:func:`~recipekit.image.matrix.pip_packages`), the Dockerfile template and the runtime's source files. So every
bundle of one stack — any learning rate, batch, node count, data — names the same image, and ``recipekit image build``
of a second such bundle finds it built.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from typing import TYPE_CHECKING

from recipekit.base.paths import TEMPLATES_DIR
from recipekit.image.matrix import ImageFamily, dockerfile_values, pip_packages
from recipekit.image.runtimefiles import runtime_sources
from recipekit.recipe.k8snames import k8s_name
from recipekit.recipe.schema import to_data

if TYPE_CHECKING:
    from recipekit.recipe.sections import Recipe

#: Hex digits of the stack digest in the image tag.
TAG_LENGTH = 12
#: The image repository's prefix under the registry: recipekit-<family>.
REPOSITORY_PREFIX = "recipekit-"
#: The template the bundle's Dockerfile is rendered from.
DOCKERFILE_TEMPLATE = "Dockerfile.j2"


@lru_cache(maxsize=4)
def _sources_digest(engine: str) -> str:
    """The Dockerfile template and every runtime source file the engine's image holds, as one digest (read once per
    process)."""
    sha = hashlib.sha256((TEMPLATES_DIR / DOCKERFILE_TEMPLATE).read_bytes())
    for name, path in runtime_sources(engine).items():
        sha.update(name.encode() + b"\0")
        sha.update(hashlib.sha256(path.read_bytes()).digest())
    return sha.hexdigest()


def stack(recipe: Recipe, family: ImageFamily, deepspeed: bool) -> dict[str, object]:
    """What the image is built from, as data: equal stacks build equal images.

    The family's tracker clients are left out of its row: a tracker enters the stack through the pins alone, and
    only for recipes that report to it, so pinning a tracker in the matrix moves no other recipe's image.
    """
    family_data = {key: value for key, value in to_data(family).items() if key != "trackers"}
    return {
        "family": family_data,
        "dockerfile": dockerfile_values(recipe, family),
        "pins": pip_packages(recipe, family, deepspeed),
        "sources": _sources_digest(recipe.engine.kind),
    }


def stack_digest(recipe: Recipe, family: ImageFamily, deepspeed: bool) -> str:
    """A short hash of :func:`stack`: the image tag."""
    canonical = json.dumps(stack(recipe, family, deepspeed), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:TAG_LENGTH]


def image_reference(recipe: Recipe, family_name: str, family: ImageFamily, deepspeed: bool) -> str:
    """The image the Job runs: ``<cluster.image_registry>/recipekit-<family>:<stack digest>``, shared by every
    bundle of the stack."""
    registry = recipe.cluster.image_registry.rstrip("/")
    repository = k8s_name(REPOSITORY_PREFIX + family_name)
    return f"{registry}/{repository}:{stack_digest(recipe, family, deepspeed)}"
