"""The image matrix only pins combinations from torch_npu's compatibility table."""

from __future__ import annotations

from dataclasses import replace

from recipekit.images import compatibility_problems, load_images


def test_shipped_matrix_is_compatible() -> None:
    images = load_images()
    for name, family in images.families.items():
        assert compatibility_problems(name, family, images.torch_npu_table) == [], name


def test_wrong_torch_or_cann_is_reported() -> None:
    images = load_images()
    family = images.families["ascend-910b"]
    bad_torch = compatibility_problems("x", replace(family, torch="2.8.0"), images.torch_npu_table)
    assert "needs torch 2.9.0" in bad_torch[0].message
    bad_cann = compatibility_problems("x", replace(family, cann="8.5.0", base_tag="8.5.0-910b"), images.torch_npu_table)
    assert "needs CANN 9.0.0" in bad_cann[0].message
    unknown = compatibility_problems("x", replace(family, torch_npu="9.9.9"), images.torch_npu_table)
    assert "not in torch_npu's compatibility table" in unknown[0].message
