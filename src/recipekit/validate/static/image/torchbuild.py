"""The ``image.torch-build`` check: the torch each architecture's image really gets, from the index it comes from.

An image whose torch comes from TORCH_INDEX_URL (Ascend, CPU) needs torch's CPU build: torch_npu runs on it, and
the CUDA build pulls gigabytes of ``nvidia-*`` wheels in (one of which fails ``pip check`` on aarch64). PyPI's
Linux torch is the CUDA build on both architectures, and x86_64's ``+cpu`` build exists only on the PyTorch CPU
index, so the index decides which torch the image gets, and a PyPI mirror configured as
``cluster.torch_index_url`` gets the wrong one. This check resolves what the Dockerfile installs for each
architecture it builds for: ``torch==<build>`` against the Dockerfile's TORCH_INDEX_URL (its dependencies from
PIP_INDEX_URL, as the second pip install takes them), for that architecture's platform, with uv as
``image.resolve`` does. It fails on a CUDA build (a ``+cu`` version, ``nvidia-*`` / ``cuda-*`` requirements) and on
an index that has no such build; it skips, with the reason, where the index is not reachable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipekit.image.matrix import ARCHS
from recipekit.validate.shared.results import Result, Status
from recipekit.validate.static.image.stack import DOCKERFILE, stack_of

if TYPE_CHECKING:
    from recipekit.validate.shared.loader import Bundle

#: Distributions only a CUDA build of torch requires.
CUDA_PREFIXES = ("nvidia-", "cuda-")


def cuda_parts(packages: dict[str, str]) -> list[str]:
    """What marks a resolution's torch as a CUDA build: its ``+cu`` version, the CUDA wheels it pulled in."""
    found = [f"{name}=={version}" for name, version in sorted(packages.items()) if name.startswith(CUDA_PREFIXES)]
    torch = packages.get("torch", "")
    return ([f"torch=={torch}"] if "+cu" in torch else []) + found


def check_torch_build(bundle: Bundle) -> Result:
    """Per architecture: the torch TORCH_INDEX_URL gives is a CPU build (no CUDA wheels), and it exists there."""
    result = Result("image.torch-build", "torch from TORCH_INDEX_URL is the CPU build, for every architecture")
    stack = stack_of(bundle)
    if isinstance(stack, str):
        return result.skip(stack)
    index = stack.dockerfile.args.get("TORCH_INDEX_URL")
    if not index:
        wanted = stack.family.torch_index if stack.family else None
        if wanted:
            return result.skip(
                f"no ARG TORCH_INDEX_URL, though torch comes from {wanted} (reported by image.dockerfile)"
            )
        return result.skip(f"torch comes from the package index with the rest (image family {stack.family_name})")
    from recipekit.validate.static.image.pypi import Unreachable, platform_tag, reachable, resolve

    why = reachable(index)
    if why is not None:
        return result.skip(f"TORCH_INDEX_URL is not reachable: {why}; the torch builds were not checked")
    glibc = stack.family.glibc if stack.family else "2.28"
    checked, skipped = [], []
    for label, build in stack.dockerfile.torch_builds.items():
        arch = label.split("|")[0]
        machine = ARCHS.get(arch)
        if machine is None:
            continue
        platform = platform_tag(machine, glibc)
        try:
            resolution = resolve(
                [f"torch=={build}"],
                python=stack.python,
                platform=platform,
                # uv prefers an extra index to the default one, and takes a package from the first index that has
                # it: torch from TORCH_INDEX_URL, its dependencies from wherever the Dockerfile's pip finds them.
                index_url=stack.index_url,
                extra_index_urls=(index, *stack.extra_index_urls),
            )
        except Unreachable as exc:
            skipped.append(f"linux/{arch}: {exc}")
            continue
        where = f"linux/{arch} (Python {stack.python}, {platform})"
        if not resolution.ok:
            result.fail(
                DOCKERFILE,
                "ARG TORCH_INDEX_URL",
                f"{index} has no torch=={build} for {where}: {resolution.explanation}",
                hint=_HINT,
            )
            continue
        result.details[arch] = resolution.packages
        cuda = cuda_parts(resolution.packages)
        if cuda:
            result.fail(
                DOCKERFILE,
                "ARG TORCH_INDEX_URL",
                f"torch=={build} from {index} is a CUDA build for {where}: it requires "
                f"{', '.join(cuda[:4])}{' ...' if len(cuda) > 4 else ''} (a PyPI mirror's torch), but this image "
                "needs the CPU build",
                hint=_HINT,
            )
            continue
        checked.append(f"linux/{arch} torch {resolution.packages.get('torch', build)}")
    if skipped and not checked and result.status is Status.PASS:
        return result.skip("; ".join(skipped))
    if result.status is Status.PASS:
        result.reason = f"CPU builds from {index}: " + ", ".join(checked)
        if skipped:
            result.reason += "; not checked: " + "; ".join(skipped)
    return result


_HINT = (
    "cluster.torch_index_url: the PyTorch CPU index (https://download.pytorch.org/whl/cpu) or a mirror of it; "
    "a PyPI mirror has no +cpu build on x86_64 and only the CUDA build on aarch64"
)
