"""The image check: the Dockerfile's base image and torch / torch_npu pins form a row of torch_npu's compatibility
table, and match the image matrix family and the manifest's recorded versions.

A pin that drifts from the table builds an image that imports torch_npu and then fails on the first NPU op, far
from the file that caused it; this check names the FROM line or the pin instead.
"""

from __future__ import annotations

from recipekit.bundle.files import DOCKERFILE
from recipekit.validate.shared.loader import Bundle
from recipekit.validate.shared.results import Result, Status


def check_image(bundle: Bundle) -> Result:
    """FROM tag and torch / torch_npu pins in the Dockerfile against torch_npu's compatibility table."""
    result = Result("consistency.image", "Dockerfile FROM and torch/torch_npu pins: a row of torch_npu's table")
    if bundle.dockerfile is None:
        return result.skip("no Dockerfile")
    from recipekit.image.dockerfile import parse, split_image
    from recipekit.image.matrix import ARCHS, ImageFamily, base_reference, compatibility_problems, load_images

    images = load_images()
    parsed_file = parse(bundle.dockerfile)
    base = parsed_file.base
    if not base:
        return result.skip("no FROM instruction (reported by files.parse)")
    image, tag = split_image(base)
    arch = bundle.recipe.hw.arch if bundle.recipe else "amd64"
    build = parsed_file.torch_for((arch, ARCHS[arch]))
    torch = build.split("+")[0] if build else None
    torch_npu = parsed_file.pins.get("torch-npu")
    if torch is None:
        result.fail(DOCKERFILE, "RUN pip install torch", f"torch is not pinned for {arch} (torch==<version>)")
    family_name = bundle.recipe.hw.image_family if bundle.recipe else None
    family = images.families.get(family_name) if family_name else None
    if family is not None and family.torch_npu and torch_npu is None:
        result.fail(
            DOCKERFILE,
            "RUN pip install torch_npu",
            f"image family {family_name} pins torch_npu {family.torch_npu}; the Dockerfile has no torch_npu==<version>",
        )
    cann = None
    if "cann" in image:
        cann = tag.split("-")[0] if "-" in tag else None
        if bundle.recipe is not None and f"-{bundle.recipe.hw.chip}-" not in f"-{tag}-":
            result.fail(
                DOCKERFILE,
                "FROM",
                f"{base}: the tag is not for chip {bundle.recipe.hw.chip}",
                hint="tags are <cann>-<chip>-<os>-py<ver>",
            )
    if torch_npu is not None and torch is not None:
        parsed = ImageFamily(
            base_image=image,
            base_tag=tag,
            cann=cann,
            python="",
            torch=torch,
            torch_npu=torch_npu,
            torch_index="",
            cann_env=[],
            bitsandbytes="",
            packages={},
        )
        for problem in compatibility_problems(family_name or "dockerfile", parsed, images.torch_npu_table):
            result.fail(DOCKERFILE, "FROM / torch / torch_npu", problem.message, problem.hint)
    if family is not None:
        expected = base_reference(family, bundle.recipe.cluster.base_image_registry if bundle.recipe else None)
        if base != expected:
            result.fail(DOCKERFILE, "FROM", f"{base}, but images/matrix.yaml family {family_name} is {expected}")
        for name, have, want in (
            ("torch", build, family.torch_builds.get(arch)),
            ("torch_npu", torch_npu, family.torch_npu),
        ):
            if have != want:
                result.fail(DOCKERFILE, f"RUN pip install {name}", f"{have}, but family {family_name} pins {want}")
    versions = bundle.manifest.get("versions") if isinstance(bundle.manifest.get("versions"), dict) else {}
    pins = {**parsed_file.pins, **({"torch": torch} if torch else {})}
    for name, pinned in pins.items():
        recorded = versions.get(name, versions.get(name.replace("-", "_")))
        if recorded is not None and str(recorded) != pinned:
            result.fail(
                DOCKERFILE, f"RUN pip install {name}", f"{pinned}, but manifest.json versions.{name} = {recorded}"
            )
    if versions.get("base_image") and versions["base_image"] != base:
        result.fail(DOCKERFILE, "FROM", f"{base}, but manifest.json versions.base_image = {versions['base_image']}")
    if result.status is Status.PASS:
        result.reason = f"{base}, torch {build}" + (f", torch_npu {torch_npu} (CANN {cann})" if torch_npu else "")
    return result
