"""The ``image.*`` checks: the image a bundle ships, held against what its base and its libraries declare.

The other checks prove the bundle's files agree with each other, and the dry run proves them on this machine's
stack. Neither looks at what the Dockerfile installs on the cluster, which is where a bundle that passes them can
still fail: a base without Python, pins whose declared minimums exclude each other, a feature whose system library
is missing, torch older than the features run.sh relies on, an image for the wrong CPU. Each check here is one
such rule; each failure names the Dockerfile line to change and the library's own number behind it:

* ``image.dockerfile`` — the Dockerfile builds on its base and honours mirrors (a Python where the base has none,
  build args for the base and the indexes, no directive that needs Docker Hub, the base's own pins kept).
* ``image.arch`` — one CPU architecture throughout: the hardware's, the torch build's, the Job's node selector,
  the README's ``--platform``.
* ``image.resolve`` — the pins resolve together for the image's Python and platform (uv against the index; skipped
  with the reason when there is no network).
* ``image.minimums`` — minimums the libraries declare in code rather than metadata (transformers'
  ``*_MIN_VERSION``: bitsandbytes, accelerate, ...).
* ``image.system`` — system packages the recipe's features need (libaio for NVMe offload).
* ``image.torch-features`` — torch features run.sh and train.py rely on, against the pinned torch.
* ``image.skew`` — what the dry run ran versus what the image installs, and what the dry run therefore did not
  prove.
* ``image.engine`` — an engine's stack (engine=megatron): the Dockerfile installs the matrix's frozen set, its git
  sources at their commits and its sdists; and what of it this machine cannot prove (the git sources, the sdists
  built at image build, the declared requirements left out, the family's own kernels).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from recipekit.bundle.files import DOCKERFILE, JOB, LAUNCH, README
from recipekit.image.dockerfile import Dockerfile, normalize, parse, split_image
from recipekit.image.enginestack import EngineStack, engine_pins
from recipekit.image.matrix import ARCH_LABEL, ARCHS, ImageFamily, features, load_images
from recipekit.validate.shared.loader import Bundle
from recipekit.validate.shared.results import Result, Status

#: Features the bundle's launch uses that only some torch releases have: (file, what it contains, the first torch
#: release that honours it, what happens with an older one). launch.json's env reaches torchrun's environment.
TORCH_FEATURES = (
    (
        LAUNCH,
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
        "2.12",
        "torchrun reads it only from torch 2.12 on; an older torchrun SIGKILLs the workers 30 s after SIGTERM, "
        "before train.py's last checkpoint is written",
    ),
)
#: transformers' minimums kept in code (utils/import_utils.py), by constant prefix -> the distribution it bounds.
TRANSFORMERS_MINIMUMS = {"ACCELERATE": "accelerate", "BITSANDBYTES": "bitsandbytes", "PEFT": "peft"}
#: What each package of the stack decides in a run: what the dry run did not prove when its version differs.
BEHAVIOURS = {
    "python": "interpreter behaviour and every C extension's build",
    "torch": "torchrun's launch and its SIGTERM -> checkpoint -> exit sequence, process-group set-up and teardown",
    "transformers": "the Trainer loop, its arguments and its checkpoint format",
    "deepspeed": "ZeRO partitioning, offload and DeepSpeed's checkpoint format",
    "accelerate": "the Trainer's device and process-group set-up",
    "peft": "LoRA wrapping, saving and merging",
    "datasets": "data loading and its cache",
    "tokenizers": "tokenization",
    "tensorboard": "TensorBoard logging",
    "bitsandbytes": "4-bit loading (QLoRA)",
}
#: What a CPU dry run never exercises, by hardware vendor.
NEVER_PROVEN = {
    "ascend": "torch_npu, CANN and HCCL: the dry run trains on CPU with gloo",
    "nvidia": "CUDA kernels and NCCL: the dry run trains on CPU with gloo",
}


@dataclass(frozen=True)
class ImageStack:
    """A bundle's image as the Dockerfile builds it, with the matrix family it claims to be."""

    dockerfile: Dockerfile
    family_name: str
    family: ImageFamily | None
    arch: str
    python: str
    torch_build: str | None
    pins: dict[str, str]
    index_url: str
    extra_index_urls: tuple[str, ...]

    @property
    def machine(self) -> str:
        return ARCHS[self.arch]

    @property
    def torch(self) -> str | None:
        """The torch build's public version (``2.12.0+cpu`` -> ``2.12.0``)."""
        return self.torch_build.split("+")[0] if self.torch_build else None


def stack_of(bundle: Bundle) -> ImageStack | str:
    """The bundle's image stack, or why it cannot be read (a skip reason)."""
    if bundle.dockerfile is None:
        return "no Dockerfile"
    if bundle.recipe is None:
        return "needs a parseable recipe.yaml (reported by files.parse)"
    parsed = parse(bundle.dockerfile)
    if not parsed.base:
        return "no FROM instruction (reported by files.parse)"
    hw = bundle.recipe.hw
    family = load_images().families.get(hw.image_family)
    python = _python_of(parsed, family)
    if python is None:
        return "cannot tell the image's Python version"
    extra = parsed.args.get("PIP_EXTRA_INDEX_URL") or ""
    return ImageStack(
        dockerfile=parsed,
        family_name=hw.image_family,
        family=family,
        arch=hw.arch,
        python=python,
        torch_build=parsed.torch_for((hw.arch, ARCHS[hw.arch])),
        pins=dict(parsed.pins),
        index_url=parsed.args.get("PIP_INDEX_URL") or "https://pypi.org/simple",
        extra_index_urls=tuple(extra.split()),
    )


def _python_of(parsed: Dockerfile, family: ImageFamily | None) -> str | None:
    """The Python the image runs: the one the Dockerfile installs (ARG PYTHON), the base tag's ``-pyX.Y``, or the
    matrix's."""
    for text in (parsed.args.get("PYTHON") or "", split_image(parsed.base or "")[1]):
        match = re.search(r"(?:python|py)(3\.\d+)", text)
        if match:
            return match.group(1)
    return family.python if family else None


def _skip_or(bundle: Bundle, result: Result) -> ImageStack | None:
    stack = stack_of(bundle)
    if isinstance(stack, str):
        result.skip(stack)
        return None
    return stack


def _version(text: str) -> tuple[int, ...]:
    """A release's numeric part, for ordering (``2.12.0+cpu`` -> (2, 12, 0)); enough for pins and minimums."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text).release
    except InvalidVersion:
        return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


# -------------------------------------------------------------------------------------------------------- checks
def check_dockerfile(bundle: Bundle) -> Result:
    """The Dockerfile builds on its real base, and a mirror given as a build arg reaches every pull."""
    result = Result("image.dockerfile", "Dockerfile builds on its base and honours mirrors (base, indexes, Python)")
    stack = _skip_or(bundle, result)
    if stack is None:
        return result
    df, family = stack.dockerfile, stack.family
    if "syntax" in df.directives:
        result.fail(
            DOCKERFILE,
            "line 1",
            f"`# syntax={df.directives['syntax']}` makes BuildKit pull its frontend from Docker Hub first",
            hint="remove the directive: nothing in the file needs a newer frontend",
        )
    written = df.base_written or ""
    if "$" not in written:
        result.fail(DOCKERFILE, "FROM", f"{written} is hard-coded: a registry mirror cannot replace it", hint=_ARG_HINT)
    elif df.args.get("BASE_IMAGE") is None and "BASE_IMAGE" in written:
        result.fail(DOCKERFILE, "ARG BASE_IMAGE", "has no default: a plain `docker build` fails", hint=_ARG_HINT)
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        if name not in df.args:
            result.fail(
                DOCKERFILE,
                f"ARG {name}",
                "not declared: pip reads it from the environment, so without the ARG a mirror given with "
                "--build-arg never reaches pip",
            )
    for url in df.index_urls:
        if "$" not in url:
            result.fail(
                DOCKERFILE,
                "RUN pip install --index-url",
                f"{url} is hard-coded: it overrides PIP_INDEX_URL, so a mirror is ignored",
                hint='declare an ARG for it and use --index-url "${TORCH_INDEX_URL}"',
            )
    if family is not None and family.torch_index and "TORCH_INDEX_URL" not in df.args:
        result.fail(DOCKERFILE, "ARG TORCH_INDEX_URL", f"not declared, but torch comes from {family.torch_index}")
    if family is not None and family.python_packages:
        missing_python = _pip_before_python(df)
        if missing_python:
            base = split_image(df.base or "")[0]
            result.fail(
                DOCKERFILE,
                f"line {missing_python}",
                f"pip runs before any Python is installed, and {base} ships none: the build stops with "
                "'pip: not found' (exit 127)",
                hint="apt-get install " + " ".join(family.python_packages) + " first (images/matrix.yaml)",
            )
    if family is not None:
        for name, version in family.base_packages.items():
            if stack.pins.get(normalize(name)) != version:
                result.fail(
                    DOCKERFILE,
                    "RUN pip install",
                    f"{name} is not pinned to the base image's {version} ({split_image(df.base or '')[0]}'s own "
                    f"tools need it): pip may replace it",
                    hint=f"pin {name}=={version} with the stack",
                )
    if result.status is Status.PASS:
        result.reason = f"FROM ${{BASE_IMAGE}} ({df.base}); pip indexes from build args; Python {stack.python}"
    return result


_ARG_HINT = "ARG BASE_IMAGE=<image:tag> before FROM ${BASE_IMAGE}"


def _pip_before_python(df: Dockerfile) -> int | None:
    """The line of the first pip RUN when no earlier RUN installed a Python; None when one did."""
    has_python = False
    for instruction in df.instructions:
        if instruction.keyword != "RUN":
            continue
        args = instruction.args
        if re.search(r"apt-get\s+install", args) and any(re.match(r"python3(\.\d+)?$", p) for p in df.apt_packages):
            has_python = True
        if re.search(r"\bpip3?\b", args) and not has_python:
            return instruction.line
    return None


def check_arch(bundle: Bundle) -> Result:
    """One CPU architecture throughout, or the pods die with "exec format error"."""
    result = Result("image.arch", "one CPU architecture: hardware, torch build, Job node selector, --platform")
    stack = _skip_or(bundle, result)
    if stack is None:
        return result
    arch = stack.arch
    if stack.torch_build is None:
        result.fail(
            DOCKERFILE,
            "RUN case ${TARGETARCH}",
            f"no torch build for {arch} ({stack.machine}): the image cannot be built for the nodes",
            hint=f"images/matrix.yaml families.{stack.family_name}.torch_builds",
        )
    if "TARGETARCH" not in stack.dockerfile.args:
        result.fail(
            DOCKERFILE,
            "ARG TARGETARCH",
            "not declared: the torch build is not chosen for the platform being built",
        )
    job = bundle.job or {}
    tasks = (job.get("spec") or {}).get("tasks") or []
    for index, task in enumerate(tasks if isinstance(tasks, list) else []):
        spec = ((task or {}).get("template") or {}).get("spec") or {}
        selected = (spec.get("nodeSelector") or {}).get(ARCH_LABEL)
        if selected != arch:
            where = f"spec.tasks[{index}].template.spec.nodeSelector"
            what = f"{ARCH_LABEL}: {selected}" if selected else f"no {ARCH_LABEL}"
            result.fail(
                JOB,
                where,
                f"{what}, but the image is built for {arch}: pods on other nodes fail with 'exec format error'",
                hint=f"{ARCH_LABEL}: {arch}",
            )
    readme = bundle.text(README)
    if readme is not None and "docker build" in readme and f"--platform linux/{arch}" not in readme:
        result.fail(
            README, "docker build", f"builds without --platform linux/{arch}: on another CPU it builds for that"
        )
    if result.status is Status.PASS:
        result.reason = f"linux/{arch}: torch {stack.torch_build}, Job selects {ARCH_LABEL}={arch}"
    return result


def check_resolve(bundle: Bundle) -> Result:
    """The pins resolve together for the image's Python and platform, with the base's own pins kept."""
    result = Result("image.resolve", "the pins resolve together for the image's Python and platform (uv, PyPI)")
    stack = _skip_or(bundle, result)
    if stack is None:
        return result
    from recipekit.validate.static.image.pypi import Unreachable, platform_tag, resolve

    if stack.torch is None:
        return result.skip("no torch build for this architecture (reported by image.arch)")
    glibc = stack.family.glibc if stack.family else "2.28"
    platform = platform_tag(stack.machine, glibc)
    requirements = [f"torch=={stack.torch}", *(f"{name}=={version}" for name, version in sorted(stack.pins.items()))]
    kept = tuple(f"{n}=={v}" for n, v in sorted((stack.family.base_packages if stack.family else {}).items()))
    engine = _engine_stack(bundle, stack)
    if engine is not None:  # installed --no-deps: each pin must exist; pip check at build covers the rest
        requirements = [r for r in requirements if normalize(r.split("==")[0]) not in _sdists(engine)]
    try:
        resolution = resolve(
            requirements,
            python=stack.python,
            platform=platform,
            index_url=stack.index_url,
            extra_index_urls=stack.extra_index_urls,
            constraints=kept,
            # Every requirement on torch (torch_npu's ``torch==X+cpu`` on x86_64 among them) is met by the image's
            # own build, which comes from TORCH_INDEX_URL: resolve its public version in its place.
            overrides=(f"torch=={stack.torch}",),
            no_deps=engine is not None,
        )
    except Unreachable as exc:
        return result.skip(f"{exc}; the pins were not resolved")
    where = f"Python {stack.python}, linux/{stack.arch} ({platform})"
    if not resolution.ok:
        result.fail(DOCKERFILE, "RUN pip install", f"no set of versions satisfies the pins for {where}: "
                    f"{resolution.explanation}")  # fmt: skip
        return result
    result.details["resolved"] = resolution.packages
    note = ""
    if stack.torch_build != stack.torch:
        note = (
            f"; torch {stack.torch_build} is the TORCH_INDEX_URL build, resolved here as its public version "
            f"{stack.torch} (torch_npu's and the others' requirements on torch hold for both)"
        )
    if engine is not None:
        note += (
            "; the engine's frozen set: each pin found, installed --no-deps (its declared requirements are "
            "checked by the build's pip check, image.engine)"
        )
    result.reason = f"{len(resolution.packages)} packages for {where} from {stack.index_url}{note}"
    return result


def _engine_stack(bundle: Bundle, stack: ImageStack) -> EngineStack | None:
    """The matrix's stack of the bundle's engine on its family; None for the Trainer or an unknown family."""
    if bundle.recipe is None or stack.family is None:
        return None
    return stack.family.engines.get(bundle.recipe.engine.kind)


def _sdists(engine: EngineStack) -> set[str]:
    """The stack's packages built from an sdist against the installed torch: no index resolves them for a platform."""
    return {normalize(name) for name in engine.build_packages}


def check_minimums(bundle: Bundle) -> Result:
    """transformers' own minimums (kept in code, so no resolver sees them) against the image's pins."""
    result = Result("image.minimums", "transformers' declared minimums (bitsandbytes, accelerate, peft) vs the pins")
    stack = _skip_or(bundle, result)
    if stack is None:
        return result
    recipe = bundle.recipe
    assert recipe is not None
    bitsandbytes = {name: v for name, v in stack.pins.items() if name.startswith("bitsandbytes")}
    if recipe.mode.kind == "qlora" and not bitsandbytes:
        result.fail(DOCKERFILE, "RUN pip install", "mode qlora loads the base in 4 bits, but no bitsandbytes is pinned")
    transformers = stack.pins.get("transformers")
    if transformers is None:
        return result.skip("transformers is not pinned") if result.status is Status.PASS else result
    from recipekit.validate.static.image.pypi import Unreachable, wheel_file

    try:
        source = wheel_file(
            "transformers", transformers, "transformers/utils/import_utils.py", index_url=stack.index_url
        )
    except (Unreachable, KeyError) as exc:
        return result.skip(f"transformers {transformers}'s source is not at hand: {exc}")
    minimums = dict(re.findall(r'^([A-Z_]+)_MIN_VERSION\s*=\s*"([^"]+)"', source, re.MULTILINE))
    checked = []
    for constant, distribution in TRANSFORMERS_MINIMUMS.items():
        minimum = minimums.get(constant)
        if minimum is None:
            continue
        pinned = {n: v for n, v in stack.pins.items() if n == distribution or n.startswith(distribution + "-")}
        for name, version in pinned.items():
            checked.append(f"{name} {version} >= {minimum}")
            if _version(version) < _version(minimum):
                result.fail(
                    DOCKERFILE,
                    f"RUN pip install {name}",
                    f"{name} {version}, but transformers {transformers} needs {distribution} >= {minimum} "
                    f"({constant}_MIN_VERSION): it refuses to load it",
                    hint=f"a {distribution} >= {minimum} for this platform, or another mode",
                )
    if result.status is Status.PASS:
        result.reason = f"transformers {transformers}: " + (", ".join(checked) or "none of its minimums is pinned")
    return result


def check_system(bundle: Bundle) -> Result:
    """System libraries the recipe's features compile or load against are in the image."""
    result = Result("image.system", "system packages the recipe's features need are installed (libaio for NVMe)")
    stack = _skip_or(bundle, result)
    if stack is None:
        return result
    recipe = bundle.recipe
    assert recipe is not None
    wanted = features(recipe)
    if stack.family is None:
        return result.skip(f"unknown image family {stack.family_name}")
    for feature in wanted:
        for package in stack.family.feature_packages.get(feature, []):
            if package not in stack.dockerfile.apt_packages:
                result.fail(
                    DOCKERFILE,
                    "RUN apt-get install",
                    f"{package} is not installed, but the recipe offloads to NVMe: DeepSpeed's async_io op needs "
                    f"it and {split_image(stack.dockerfile.base or '')[0]} does not have it (optimizer init fails)",
                    hint=f"apt-get install {package}",
                )
    if result.status is Status.PASS:
        result.reason = ", ".join(f"{f}: {' '.join(stack.family.feature_packages.get(f, []))}" for f in wanted) or (
            "no feature needs a system package"
        )
    return result


def check_torch_features(bundle: Bundle) -> Result:
    """What run.sh and train.py rely on exists in the image's torch."""
    result = Result("image.torch-features", "torch features run.sh/train.py rely on exist in the pinned torch")
    stack = _skip_or(bundle, result)
    if stack is None:
        return result
    if stack.torch is None:
        return result.skip("no torch build for this architecture (reported by image.arch)")
    used = []
    for file, needle, since, consequence in TORCH_FEATURES:
        if needle not in (bundle.text(file) or ""):
            continue
        used.append(f"{needle} (>= {since})")
        if _version(stack.torch) < _version(since):
            result.fail(
                DOCKERFILE,
                "RUN pip install torch",
                f"torch {stack.torch_build}, but {file} sets {needle}: {consequence}",
                hint=f"torch >= {since} (for Ascend, a torch_npu table row with it)",
            )
    if result.status is Status.PASS:
        result.reason = f"torch {stack.torch_build}: " + (", ".join(used) or "no version-bound feature used")
    return result


def check_skew(bundle: Bundle) -> Result:
    """The dry run's stack (this environment) against the image's: each difference is something it did not prove."""
    result = Result("image.skew", "dry-run stack vs image stack: what the dry run did not prove")
    stack = _skip_or(bundle, result)
    if stack is None:
        return result
    from importlib import metadata

    try:
        metadata.version("torch")
    except metadata.PackageNotFoundError:
        return result.skip("the training stack is not installed here: there is no dry-run stack to compare")
    image = {"python": stack.python, **({"torch": stack.torch_build} if stack.torch_build else {}), **stack.pins}
    skew, unproven = [], []
    for name, behaviour in BEHAVIOURS.items():
        pinned = next((v for n, v in image.items() if n == name or n.startswith(name + "-")), None)
        if pinned is None:
            continue
        if name == "python":
            here = ".".join(str(part) for part in sys.version_info[:2])
        else:
            try:
                here = metadata.version(name)
            except metadata.PackageNotFoundError:
                here = "not installed"
        if _version(pinned) != _version(here)[: len(_version(pinned))] or here == "not installed":
            skew.append({"package": name, "image": pinned, "dry_run": here, "not_proven": behaviour})
            unproven.append(behaviour)
    hw = bundle.recipe.hw if bundle.recipe else None
    never = NEVER_PROVEN.get(hw.vendor) if hw else None
    if hw is not None and never is None and hw.torch_device != "cpu":
        never = f"{hw.vendor}'s {hw.torch_device} kernels and collectives: the dry run trains on CPU with gloo"
    result.details.update(skew=skew, never_proven=never)
    parts = [f"{s['package']} {s['image']} (dry run {s['dry_run']})" for s in skew]
    text = "image vs dry run: " + ("; ".join(parts) if parts else "same versions")
    if unproven:
        text += ". Not proven by the dry run: " + "; ".join(unproven)
    if never:
        text += f". Never proven by a CPU dry run: {never}"
    result.reason = text
    return result


def check_engine(bundle: Bundle) -> Result:
    """An engine's stack: the Dockerfile installs the matrix's set, and what of it this machine cannot prove."""
    result = Result("image.engine", "the engine's stack: the matrix's pins, git commits, and what is not proven here")
    stack = _skip_or(bundle, result)
    if stack is None:
        return result
    recipe = bundle.recipe
    assert recipe is not None
    kind = recipe.engine.kind
    if kind == "trainer":
        result.reason = "no engine stack: the Trainer runs the family's Python stack (image.resolve, image.skew)"
        return result
    engine = _engine_stack(bundle, stack)
    if engine is None:
        result.fail(DOCKERFILE, "RUN pip install", f"image family {stack.family_name} has no {kind} stack "
                    f"(images/matrix.yaml families.{stack.family_name}.engines)")  # fmt: skip
        return result
    kept = stack.family.base_packages if stack.family else {}
    wanted = dict(pin.split("==", 1) for pin in engine_pins(engine, kept=kept))
    wanted |= dict(engine.build_packages)
    for name, version in sorted(wanted.items()):
        found = stack.pins.get(normalize(name))
        if found != version:
            result.fail(DOCKERFILE, f"RUN pip install {name}", f"the {kind} stack pins {name}=={version}, the "
                        f"Dockerfile installs {found or 'none'}", hint="rebuild the bundle")  # fmt: skip
    runs = stack.dockerfile.run_text()
    for name, source in sorted(engine.git.items()):
        if f"git+{source}" not in runs:
            result.fail(DOCKERFILE, f"RUN pip install {name}", f"the {kind} stack installs {name} from {source}; "
                        "the Dockerfile does not", hint="rebuild the bundle")  # fmt: skip
    if result.status is not Status.PASS:
        return result
    git = "; ".join(f"{name} at {source.rsplit('@', 1)[1][:12]} from {source.rsplit('@', 1)[0]}"
                    for name, source in sorted(engine.git.items()))  # fmt: skip
    parts = [f"{kind} on {stack.family_name}: {len(wanted)} pins from images/engines/{engine.requirements}"]
    parts.append(f"Not resolved here: {git} (git sources, installed from their repositories)" if git else "")
    built = ", ".join(f"{n} {v}" for n, v in sorted(engine.build_packages.items()))
    parts.append(f"Built at image build, never here: {built}" if built else "")
    parts.append("Declared but not installed: " + ", ".join(sorted(engine.left_out)))
    parts.append(f"Not proven here: {engine.not_proven}")
    result.details.update(left_out=dict(engine.left_out), git=dict(engine.git), not_proven=engine.not_proven)
    result.reason = ". ".join(part for part in parts if part)
    return result


#: The image checks, in report order (run by :func:`recipekit.validate.static.checks.run_static`).
CHECKS: tuple[Callable[[Bundle], Result], ...] = (
    check_dockerfile,
    check_arch,
    check_resolve,
    check_minimums,
    check_system,
    check_torch_features,
    check_skew,
    check_engine,
)
