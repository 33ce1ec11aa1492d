"""The image matrix only pins combinations from torch_npu's compatibility table."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from recipekit.errors import RecipeError
from recipekit.images import compatibility_problems, load_images
from recipekit.paths import IMAGES_DIR


def test_shipped_matrix_is_compatible() -> None:
    images = load_images()
    for name, family in images.families.items():
        assert compatibility_problems(name, family, images.torch_npu_table) == [], name


def test_wrong_torch_or_cann_is_reported() -> None:
    images = load_images()
    family = images.families["ascend-910b"]
    bad_torch = compatibility_problems("x", replace(family, torch="2.8.0"), images.torch_npu_table)
    assert "needs torch 2.12.0" in bad_torch[0].message
    bad_cann = compatibility_problems("x", replace(family, cann="8.5.0", base_tag="8.5.0-910b"), images.torch_npu_table)
    assert "needs CANN 9.1.0" in bad_cann[0].message
    unknown = compatibility_problems("x", replace(family, torch_npu="9.9.9"), images.torch_npu_table)
    assert "not in torch_npu's compatibility table" in unknown[0].message


def test_malformed_matrix_is_a_recipe_error_naming_the_key(tmp_path) -> None:
    shutil.copytree(IMAGES_DIR, tmp_path / "images")
    matrix = tmp_path / "images" / "matrix.yaml"
    matrix.write_text(matrix.read_text().replace("base_tag:", "base_tg:", 1))
    with pytest.raises(RecipeError) as info:
        load_images(tmp_path / "images")
    keys = {problem.key for problem in info.value.problems}
    assert any(key.endswith(".base_tg") for key in keys) and any(key.endswith(".base_tag") for key in keys), keys
