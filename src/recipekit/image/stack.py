"""The software stack an image holds, and the digest that names it: one image per stack, not per recipe.

The image holds the base, the pinned packages and recipekit's runtime, nothing of a run: each run's own files travel
beside it in the bundle's ConfigMap (bundle/runfiles.py). What it is built from is its build context: the Dockerfile,
rendered here from the image family's row of the matrix, the recipe's build-arg defaults and system packages
(:func:`~recipekit.image.matrix.dockerfile_values`) and the pinned requirements
(:func:`~recipekit.image.matrix.pip_packages`), and the runtime package it copies. The tag is the digest of exactly
those bytes (:func:`context_digest`), so every bundle of one stack — any learning rate, batch, node count, data —
names the same image, ``recipekit image build`` of a second such bundle finds it built, and anyone holding a bundle
can recompute the tag from the bundle's own Dockerfile and ``runtime/``: a Dockerfile or runtime edited after the
build no longer matches the tag the stack's other bundles run, so ``image build`` refuses to build it under that
name and ``validate`` reports it (handover/imagebuild.py, validate/static/image/context.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2

from recipekit import __version__
from recipekit.base.paths import TEMPLATES_DIR
from recipekit.image.matrix import ImageFamily, dockerfile_values, pip_packages
from recipekit.image.runtimefiles import runtime_sources
from recipekit.recipe.k8snames import k8s_name
from recipekit.runtime.boundary import filenames

if TYPE_CHECKING:
    from recipekit.recipe.sections import Recipe

#: Hex digits of the stack digest in the image tag.
TAG_LENGTH = 12
#: The image repository's prefix under the registry: recipekit-<family>.
REPOSITORY_PREFIX = "recipekit-"
#: The template the bundle's Dockerfile is rendered from, and its name in the bundle.
DOCKERFILE_TEMPLATE = "Dockerfile.j2"
DOCKERFILE = "Dockerfile"


def runtime_paths(engine: str) -> dict[str, Path]:
    """Bundle path (``runtime/<file>``) → source file of every runtime module ``engine``'s image holds, in a stable
    order: the runtime package as the bundle and the image carry it (image/runtimefiles.py: other engines' rooms
    left out)."""
    return {f"{filenames.RUNTIME_PACKAGE}/{name}": path for name, path in runtime_sources(engine).items()}


@lru_cache(maxsize=4)
def _runtime_sources(engine: str) -> tuple[tuple[str, bytes], ...]:
    """The runtime package's files as ``engine``'s bundles copy them (read once per process)."""
    return tuple((name, path.read_bytes()) for name, path in runtime_paths(engine).items())


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def dockerfile(recipe: Recipe, family_name: str, family: ImageFamily, deepspeed: bool) -> bytes:
    """The bundle's Dockerfile: the same bytes for every bundle of the stack."""
    context = {
        "version": __version__,
        "family_name": family_name,
        "family": family,
        "engine_kind": recipe.engine.kind,
        "image": dockerfile_values(recipe, family),
        "pins": pip_packages(recipe, family, deepspeed),
        "cann_env": family.cann_env,
        "workdir": filenames.POD_WORKDIR,
        "runtime_dir": filenames.RUNTIME_PACKAGE,
        "run_files_dir": filenames.RUN_FILES_DIR,
        "run_files_configmap": filenames.RUN_FILES_CONFIGMAP,
        "pod_command_json": json.dumps(list(filenames.POD_COMMAND)),
    }
    return _environment().get_template(DOCKERFILE_TEMPLATE).render(**context).encode()


def context_digest(dockerfile_bytes: bytes, runtime: Mapping[str, bytes]) -> str:
    """The tag of the image built from ``dockerfile_bytes`` and the ``runtime`` files it copies (bundle path →
    bytes): a hash of each file's name and content, in name order, cut to :data:`TAG_LENGTH` hex digits. A file
    edited, added or taken away changes it."""
    entries = sorted([(DOCKERFILE, dockerfile_bytes), *runtime.items()])
    lines = "".join(f"{name}\0{hashlib.sha256(data).hexdigest()}\n" for name, data in entries)
    return hashlib.sha256(lines.encode()).hexdigest()[:TAG_LENGTH]


def stack_digest(recipe: Recipe, family_name: str, family: ImageFamily, deepspeed: bool) -> str:
    """The image tag of the recipe's stack: :func:`context_digest` of its Dockerfile and recipekit's runtime."""
    runtime = dict(_runtime_sources(recipe.engine.kind))
    return context_digest(dockerfile(recipe, family_name, family, deepspeed), runtime)


def image_reference(recipe: Recipe, family_name: str, family: ImageFamily, deepspeed: bool) -> str:
    """The image the Job runs: ``<cluster.image_registry>/recipekit-<family>:<stack digest>``, shared by every
    bundle of the stack."""
    registry = recipe.cluster.image_registry.rstrip("/")
    repository = k8s_name(REPOSITORY_PREFIX + family_name)
    return f"{registry}/{repository}:{stack_digest(recipe, family_name, family, deepspeed)}"
