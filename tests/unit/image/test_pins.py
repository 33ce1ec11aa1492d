"""The dry run's stack (pyproject's ``train`` extra) is the image matrix's stack: one list of versions, bound here.

The dry run proves a bundle with the libraries pip installs from pyproject.toml; the images install images/matrix.yaml.
Where the two must agree this test fails on any drift; where they differ on purpose, the reason is named below.
"""

from __future__ import annotations

from pathlib import Path

import tomllib

from recipekit.image.matrix import load_images
from recipekit.validate.static.toolpackages import TOOL_PACKAGES

ROOT = Path(__file__).resolve().parents[3]

#: In pyproject's train extra, not in the images: the dry run's own process management.
DRY_RUN_ONLY = {
    "psutil": "the dry run's simulated pods; no bundle imports it",
    "matplotlib": "the plots of `recipekit report` and `compare --html`; no bundle imports it",
    "kubernetes": "submit, status, logs and cancel (the cluster extra, in train for the README's first command)",
}
#: In pyproject's train extra, not in the images: the tools of validate's static checks
#: (recipekit.validate.static.toolpackages).
VALIDATE_TOOLS = set(TOOL_PACKAGES.values())
#: In the images' stack, not pinned by pyproject's train extra.
IMAGE_ONLY = {"pyyaml": "a core dependency of recipekit itself (pyyaml>=6); the image pins it exactly"}


def _train_pins() -> dict[str, str]:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]
    pins = {}
    for requirement in extra:
        name, sep, version = requirement.partition("==")
        pins[name.split(">")[0].split("<")[0].strip().lower()] = version.strip() if sep else "*"
    return pins


def test_train_extra_pins_the_image_stack() -> None:
    pins, matrix = _train_pins(), load_images()
    stacks = {name: dict(family.packages) for name, family in matrix.families.items()}
    reference = stacks["cpu"]
    for name, version in reference.items():
        if name in IMAGE_ONLY:
            assert name not in pins, f"{name} is listed as image-only but pyproject pins it"
            continue
        assert pins.get(name) == version, f"pyproject train extra pins {name}=={pins.get(name)}, images {version}"
    trackers = dict(pin.split("==") for pin in matrix.families["cpu"].trackers.values())
    for name, version in trackers.items():  # the dry run runs the trackers' clients the cpu image installs
        assert pins.get(name) == version, f"pyproject train extra pins {name}=={pins.get(name)}, images {version}"
    harness = dict([(matrix.families["cpu"].evaluation or "-==-").split("==")])
    for name, version in harness.items():  # the dry run runs the benchmark harness the cpu image installs
        assert pins.get(name) == version, f"pyproject train extra pins {name}=={pins.get(name)}, images {version}"
    for name in pins:
        expected = name in reference or name == "torch" or name in DRY_RUN_ONLY or name in VALIDATE_TOOLS
        assert expected or name in trackers or name in harness, f"{name}: pinned for the dry run only"


def test_dry_run_torch_is_the_cpu_family_torch() -> None:
    """The cpu family is the image of the dry run's own stack; accelerator families name their own torch."""
    assert _train_pins()["torch"] == load_images().families["cpu"].torch
