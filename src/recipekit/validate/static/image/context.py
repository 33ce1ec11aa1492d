"""The ``image.context`` check: the image the bundle names is the one its own Dockerfile and runtime/ build.

The tag of a bundle's image is the digest of its build context (image/stack.py), so it can be recomputed from the
bundle alone. ``files.manifest`` reports a Dockerfile or runtime file edited after the build; this check reports the
same edit when manifest.json was re-hashed to hide it: the files no longer hash to the stack the tag names, and the
image built from them must not run under that name (``recipekit image build`` refuses it).
"""

from __future__ import annotations

from recipekit.bundle.files import DOCKERFILE, RECIPE, RUNTIME
from recipekit.image.dockerfile import split_image
from recipekit.image.stack import TAG_LENGTH, context_digest
from recipekit.validate.shared.loader import Bundle
from recipekit.validate.shared.results import Result, Status


def check_context(bundle: Bundle) -> Result:
    """recipe.yaml's ``plan.image`` tag is the digest of the Dockerfile and every file under runtime/."""
    result = Result("image.context", "the image tag is the digest of the bundle's Dockerfile and runtime/")
    dockerfile = bundle.raw.get(DOCKERFILE)
    image = bundle.plan.get("image")
    if dockerfile is None:
        return result.skip("no Dockerfile")
    if not isinstance(image, str) or not image:
        return result.skip("recipe.yaml has no plan.image (reported by files.parse)")
    runtime = {name: data for name, data in bundle.raw.items() if name.startswith(RUNTIME + "/")}
    stack = context_digest(dockerfile, runtime)
    tag = split_image(image)[1]
    if tag != stack:
        result.fail(
            f"{DOCKERFILE}, {RUNTIME}/",
            "",
            f"hash to stack {stack}, but {RECIPE} plan.image is {image}"
            + (" (a stack digest: another build context)" if len(tag) == TAG_LENGTH else ""),
            hint="the Dockerfile or the runtime was edited after the build: rebuild the bundle with `recipekit build`",
        )
    if result.status is Status.PASS:
        result.reason = f"{DOCKERFILE} and {len(runtime)} runtime files hash to {stack}, the tag of {image}"
    return result
