"""The base image matrix (``images/``): per hardware family, the base image and every pinned version.

Loading is I/O and happens once, in the caller; checking a family against torch_npu's published compatibility table
is pure and is used both by ``build`` (an incompatible pin stops the build) and by ``validate`` (a hand-edited
Dockerfile is caught).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from recipekit.base import yamlfile
from recipekit.base.errors import Problem
from recipekit.base.paths import IMAGES_DIR
from recipekit.image.enginestack import EngineStack, engine_pins, git_requirements
from recipekit.recipe.schema import Section, spec, validate
from recipekit.runtime.boundary.recipeview import trains_adapter

if TYPE_CHECKING:
    from recipekit.recipe.sections import ModeSpec, Recipe

#: CPU architectures by their Kubernetes / OCI names, with the name Python wheels (platform_machine) use.
ARCHS = {"amd64": "x86_64", "arm64": "aarch64"}
#: The node label the kubelet sets to the node's architecture.
ARCH_LABEL = "kubernetes.io/arch"
#: A pinned requirement: an exact version, nothing a shell or pip would read as more.
_PIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][A-Za-z0-9.+!-]*")


class ImageFamily(Section):
    """One row of images/matrix.yaml."""

    description: str = spec("", description="What the family is for.")
    base_image: str = spec(description="Base image repository.")
    base_tag: str = spec(description="Base image tag (for Ascend it starts with the CANN version).")
    cann: str | None = spec(description="CANN version inside the base image (Ascend only).")
    python: str = spec(description="Python version the image runs (X.Y): the base's own, or python_packages'.")
    glibc: str = spec("2.28", description="glibc of the base's distribution: the newest manylinux wheels it takes.")
    python_packages: list[str] = spec(
        default_factory=list, description="apt packages that give a base without Python one (empty: it has one)."
    )
    venv: str | None = spec(None, description="Virtual environment the stack goes into (a distro Python, PEP 668).")
    pip: str | None = spec(
        None,
        description="pip the install step upgrades to first, so no step depends on the base's pip (None: keep it).",
    )
    torch: str = spec(description="Pinned torch version (the public version; torch_npu's table names it).")
    torch_builds: dict[str, str] = spec(
        default_factory=dict, description="Architecture (amd64, arm64) -> the torch build installed there."
    )
    torch_npu: str | None = spec(description="Pinned torch_npu version (Ascend only).")
    torch_index: str | None = spec(
        description="pip index torch alone comes from (None: the package index, like everything else)."
    )
    base_packages: dict[str, str] = spec(
        default_factory=dict, description="Python packages the base pins for its own tools; the image keeps them."
    )
    feature_packages: dict[str, list[str]] = spec(
        default_factory=dict, description="apt packages a recipe feature needs (nvme: DeepSpeed's async I/O)."
    )
    cann_env: list[str] = spec(
        description="CANN's set_env.sh scripts the launcher sources (every one that exists; none found is an error)."
    )
    bitsandbytes: str | None = spec(
        description="pip requirement for 4-bit loading (QLoRA); None: no build works with the pinned stack."
    )
    bitsandbytes_note: str = spec("", description="Why there is no bitsandbytes (shown when QLoRA is refused).")
    double_quant: bool = spec(True, description="4-bit double quantization works on this family.")
    packages: dict[str, str] = spec(description="The Python training stack, name -> exact version.")
    trackers: dict[str, str] = spec(
        default_factory=dict,
        description="Experiment tracker (train.report_to) -> the pinned pip requirement of its client, installed "
        "only in the images of recipes that report to it.",
    )
    engines: dict[str, EngineStack] = spec(
        default_factory=dict,
        description="Engine (engine.kind) other than the Trainer -> its stack on this family, installed in place of "
        "the Python stack (image/enginestack.py).",
    )

    evaluation: str | None = spec(
        None,
        description="The pinned pip requirement of the benchmark harness (eval.enabled: lm-evaluation-harness), "
        "installed only in the images of recipes that evaluate.",
    )

    def rules(self) -> list[str]:
        broken = [f"trackers.{name}: {pin!r} is not name==version" for name, pin in self.trackers.items()]
        broken = [line for line, pin in zip(broken, self.trackers.values()) if not _PIN.fullmatch(pin)]
        if self.evaluation is not None and not _PIN.fullmatch(self.evaluation):
            broken.append(f"evaluation: {self.evaluation!r} is not name==version")
        for arch, build in self.torch_builds.items():
            if arch not in ARCHS:
                broken.append(f"torch_builds: unknown architecture {arch!r} (allowed: {', '.join(ARCHS)})")
            if build.split("+")[0] != self.torch:
                broken.append(f"torch_builds.{arch}: {build} is not a build of torch {self.torch}")
        return broken

    @property
    def base(self) -> str:
        return f"{self.base_image}:{self.base_tag}"


class ImageMatrix(Section):
    """All families plus torch_npu's compatibility table (torch_npu -> (torch, CANN))."""

    families: dict[str, ImageFamily] = spec(description="images/matrix.yaml: family name -> pinned image.")
    torch_npu_table: dict[str, tuple[str, str]] = spec(description="images/torch_npu.yaml: torch_npu -> (torch, CANN).")


def load_images(directory: Path = IMAGES_DIR) -> ImageMatrix:
    """images/ as typed records; a malformed file is a RecipeError naming the key, like a bad recipe."""
    matrix = yamlfile.read(directory / "matrix.yaml")
    table = yamlfile.read(directory / "torch_npu.yaml")
    return validate(
        ImageMatrix,
        {
            "families": (matrix or {}).get("families"),
            "torch_npu_table": {str(k): [str(v) for v in row] for k, row in table.items()},
        },
        root="images",
    )


def compatibility_problems(name: str, family: ImageFamily, table: dict[str, tuple[str, str]]) -> list[Problem]:
    """torch_npu pins torch exactly and needs one CANN: anything else fails at import time on the cluster."""
    key = f"images/matrix.yaml families.{name}"
    if family.torch_npu is None:
        return []
    row = table.get(family.torch_npu)
    if row is None:
        return [
            Problem(
                key,
                f"torch_npu {family.torch_npu} is not in torch_npu's compatibility table",
                hint="releases: " + ", ".join(table),
            )
        ]
    torch, cann = row
    problems = []
    if family.torch != torch:
        problems.append(
            Problem(key, f"torch_npu {family.torch_npu} needs torch {torch}, the matrix pins {family.torch}")
        )
    if family.cann != cann:
        problems.append(
            Problem(key, f"torch_npu {family.torch_npu} needs CANN {cann}, the base image has {family.cann}")
        )
    if family.cann and not family.base_tag.startswith(family.cann + "-"):
        problems.append(Problem(key, f"base tag {family.base_tag} does not carry CANN {family.cann}"))
    return problems


# ------------------------------------------------------------------------------------------- recipe × family
def features(recipe: Recipe) -> list[str]:
    """The recipe features that need something of the image beyond its Python stack (keys of feature_packages)."""
    par = recipe.parallel
    return ["nvme"] if "nvme" in (par.offload_optimizer, par.offload_param) else []


def apt_packages(recipe: Recipe, family: ImageFamily) -> list[str]:
    """System packages the Dockerfile installs: a Python where the base has none, what the engine's stack needs
    to install (git), then what features need."""
    wanted = list(family.python_packages)
    stack = family.engines.get(recipe.engine.kind)
    wanted += [p for p in (stack.apt_packages if stack else []) if p not in wanted]
    for feature in features(recipe):
        wanted += [p for p in family.feature_packages.get(feature, []) if p not in wanted]
    return wanted


def base_reference(family: ImageFamily, mirror: str | None) -> str:
    """FROM's default: the family's base, or the same repository and tag under a mirror registry.

    ``quay.io/ascend/cann:9.1.0-...`` under ``harbor.internal/quay`` is ``harbor.internal/quay/ascend/cann:9.1.0-...``
    (a registry host is the first path part when it has a dot or a port; Docker Hub names have none).
    """
    if not mirror:
        return family.base
    first, _, rest = family.base_image.partition("/")
    repository = rest if rest and ("." in first or ":" in first or first == "localhost") else family.base_image
    return f"{mirror.rstrip('/')}/{repository}:{family.base_tag}"


def recipe_problems(name: str, family: ImageFamily, recipe: Recipe) -> list[Problem]:
    """What this family's image cannot do for this recipe: each a build error naming the key and the reason.

    Decided from the matrix's data (which torch builds exist, which bitsandbytes the family has, whether double
    quantization works), never from the vendor's name, so a new family or a new release changes the data only.
    """
    problems = []
    arch = recipe.hw.arch
    if arch not in family.torch_builds:
        problems.append(
            Problem(
                "hw.arch",
                f"image family {name} has no torch build for {arch}",
                hint="architectures with one: " + ", ".join(family.torch_builds),
            )
        )
    return (
        problems
        + engine_problems(name, family, recipe)
        + mode_problems(name, family, recipe.mode)
        + transformers_problems(name, family, recipe)
        + tracker_problems(name, family, recipe)
        + evaluation_problems(name, family, recipe)
    )


def engine_stack(recipe: Recipe, family: ImageFamily) -> EngineStack | None:
    """The family's stack of the recipe's engine; None for the Trainer (the family's Python stack) and for an
    engine the family has none of (:func:`engine_problems` refuses that recipe)."""
    return family.engines.get(recipe.engine.kind)


def engine_problems(name: str, family: ImageFamily, recipe: Recipe) -> list[Problem]:
    """An engine other than the Trainer that this family's image has no stack of."""
    kind = recipe.engine.kind
    if kind == "trainer" or kind in family.engines:
        return []
    return [
        Problem(
            "engine",
            f"image family {name} has no {kind} stack (images/matrix.yaml families.{name}.engines)",
            hint="families with one: " + ", ".join(family.engines) if family.engines else "engine=trainer",
        )
    ]


def mode_problems(name: str, family: ImageFamily, mode: ModeSpec) -> list[Problem]:
    """What this family's image cannot do for a training mode, whatever the rest of the recipe.

    Its own function so that ``recipekit list mode`` states exactly the refusals ``build`` makes.
    """
    problems = []
    if mode.kind == "qlora":
        if family.bitsandbytes is None:
            problems.append(
                Problem(
                    "mode",
                    f"qlora needs bitsandbytes; image family {name} has none that works: {family.bitsandbytes_note}",
                    hint="mode=lora trains the same adapter on the unquantized base",
                )
            )
        elif mode.quant.double_quant and not family.double_quant:
            problems.append(
                Problem(
                    "mode.quant.double_quant",
                    f"4-bit double quantization does not work on image family {name}",
                    hint="mode.quant.double_quant=false",
                )
            )
    return problems


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def transformers_problems(name: str, family: ImageFamily, recipe: Recipe) -> list[Problem]:
    """The model's architecture needs a newer transformers than the image pins (``model.min_transformers``)."""
    needed, pinned = recipe.model.min_transformers, family.packages.get("transformers", "")
    if not needed or not pinned or _version(pinned) >= _version(needed):
        return []
    return [
        Problem(
            "model.min_transformers",
            f"{recipe.model.name} ({recipe.model.architecture or recipe.model.family}) needs transformers >= "
            f"{needed}; image family {name} pins transformers {pinned}",
            hint="raise the pin in images/matrix.yaml (python_stack) or pick a model the pinned release has",
        )
    ]


def pip_packages(recipe: Recipe, family: ImageFamily, deepspeed: bool) -> list[str]:
    """Pinned requirements the Dockerfile installs on top of torch (and torch_npu).

    The packages the base image pins for its own tools (CANN's protobuf) are pinned again, so that pip refuses a
    stack that would replace them instead of silently upgrading them. An engine's stack is its own frozen set
    (:func:`engine_stack`), with its git sources last.
    """
    stack = engine_stack(recipe, family)
    if stack is not None:
        return engine_pins(stack, kept=family.base_packages) + git_requirements(stack)
    wanted = dict(family.packages)
    if not deepspeed:
        wanted.pop("deepspeed", None)
    if not trains_adapter(recipe.mode.kind):
        wanted.pop("peft", None)
    if "tensorboard" not in recipe.train.report_to:
        wanted.pop("tensorboard", None)
    if recipe.ops.metrics_port is None:
        wanted.pop("prometheus_client", None)
    wanted.update(family.base_packages)
    pins = [f"{name}=={version}" for name, version in sorted(wanted.items())]
    if recipe.mode.kind == "qlora" and family.bitsandbytes:
        pins.append(family.bitsandbytes)
    return pins + tracker_pins(recipe, family) + evaluation_pins(recipe, family)


def evaluation_pins(recipe: Recipe, family: ImageFamily) -> list[str]:
    """The benchmark harness, for a recipe that evaluates after training (``eval.enabled``) only."""
    return [family.evaluation] if recipe.eval.enabled and family.evaluation else []


def evaluation_problems(name: str, family: ImageFamily, recipe: Recipe) -> list[Problem]:
    """An evaluation the image cannot run: no harness pinned, or an engine whose room does not evaluate."""
    if not recipe.eval.enabled:
        return []
    problems = []
    if family.evaluation is None:
        problems.append(
            Problem(
                "eval.enabled",
                f"image family {name} pins no benchmark harness (images/matrix.yaml evaluation)",
                hint="pin lm_eval in the family's evaluation, or set eval.enabled=false",
            )
        )
    if recipe.engine.kind != "trainer":
        problems.append(
            Problem(
                "eval.enabled",
                f"the {recipe.engine.kind} engine does not evaluate after training (the Trainer's room does)",
                hint="set eval.enabled=false, or engine=trainer",
            )
        )
    return problems


def tracker_pins(recipe: Recipe, family: ImageFamily) -> list[str]:
    """The pinned clients of the trackers the recipe reports to (W&B, MLflow, SwanLab), in report_to's order: only
    these images install them, so the stack of a recipe without one is what it was before trackers existed."""
    return [family.trackers[name] for name in recipe.train.report_to if name in family.trackers]


def tracker_problems(name: str, family: ImageFamily, recipe: Recipe) -> list[Problem]:
    """A tracker the recipe reports to that the family's image has no client pinned for."""
    from recipekit.recipe.sections import TRACKERS

    missing = [t for t in recipe.train.report_to if t in TRACKERS and t not in family.trackers]
    return [
        Problem(
            "train.report_to",
            f"image family {name} pins no {tracker} client (images/matrix.yaml trackers)",
            hint="pin one in the family's trackers, or report to " + ", ".join(family.trackers or ["tensorboard"]),
        )
        for tracker in missing
    ]


def dockerfile_values(recipe: Recipe, family: ImageFamily) -> dict[str, object]:
    """What templates/Dockerfile.j2 needs beyond the plan: build-arg defaults (the recipe's values), system
    packages, and the torch build per architecture; the engine's stack where the recipe runs one."""
    cluster = recipe.cluster
    stack = engine_stack(recipe, family)
    return {
        "base": base_reference(family, cluster.base_image_registry),
        "pip_index_url": cluster.pip_index_url,
        "pip_extra_index_url": cluster.pip_extra_index_url or "",
        "torch_index_url": (cluster.torch_index_url or family.torch_index) if family.torch_index else None,
        "apt_packages": apt_packages(recipe, family),
        "python_packages": family.python_packages,
        "engine_packages": stack.apt_packages if stack else [],
        "feature_packages": [
            p
            for p in apt_packages(recipe, family)
            if p not in family.python_packages and p not in (stack.apt_packages if stack else [])
        ],
        "engine": stack,
        "engine_pip_check": sorted(stack.left_out) if stack else [],
        "torch_builds": {arch: family.torch_builds[arch] for arch in ARCHS if arch in family.torch_builds},
        "machines": ARCHS,
        "arch": recipe.hw.arch,
        "pip": family.pip,
    }
