"""The runtime enables the recipe's fp32 matmul mode on its device, and only there (runtime/matmulmode.py)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from recipekit.bundle.build import resolve
from recipekit.plan.performance import performance_settings
from recipekit.runtime import matmulmode


def _fake_torch(npu: bool = False, cuda: bool = False) -> SimpleNamespace:
    flags = SimpleNamespace
    return SimpleNamespace(
        npu=SimpleNamespace(is_available=lambda: npu, matmul=flags(allow_hf32=False), conv=flags(allow_hf32=True)),
        cuda=SimpleNamespace(is_available=lambda: cuda),
        backends=SimpleNamespace(cuda=SimpleNamespace(matmul=flags(allow_tf32=False)), cudnn=flags(allow_tf32=False)),
    )


def test_hf32_is_set_on_an_npu_and_tf32_on_a_gpu() -> None:
    npu = _fake_torch(npu=True)
    assert "hf32" in matmulmode.apply("hf32", npu)
    assert npu.npu.matmul.allow_hf32 and npu.npu.conv.allow_hf32 and not npu.backends.cuda.matmul.allow_tf32
    gpu = _fake_torch(cuda=True)
    assert "tf32" in matmulmode.apply("tf32", gpu)
    assert gpu.backends.cuda.matmul.allow_tf32 and gpu.backends.cudnn.allow_tf32


def test_nothing_is_set_where_the_recipes_device_is_absent() -> None:
    cpu = _fake_torch()
    assert matmulmode.apply("hf32", cpu) == "fp32 matmuls: hf32 not set, no npu device in this process"
    assert not cpu.npu.matmul.allow_hf32
    assert "full precision" in matmulmode.apply(None)
    before = torch.backends.cuda.matmul.allow_tf32
    assert "no cuda device" in matmulmode.apply("tf32")  # the real torch of this CPU machine
    assert torch.backends.cuda.matmul.allow_tf32 == before


def test_the_hardware_options_name_their_mode_and_plan_lists_it() -> None:
    ascend = resolve(["recipe=llama3_70b_pretrain"])
    settings = {s.name: s for s in performance_settings(ascend.recipe, ascend.plan)}
    assert settings["fp32 matmuls"].value == "HF32" and "hw.fp32_matmul" in settings["fp32 matmuls"].where
    assert settings["gradient reduce overlap"].value == "on"
    assert settings["parameter gather overlap"].value == "on"
    assert "not enabled" in settings["fused attention, RMSNorm, rotary, SwiGLU"].value
    cuda = resolve(["recipe=llama3_8b_sft", "hw=h100"])
    trainer = {s.name: s for s in performance_settings(cuda.recipe, cuda.plan)}
    assert trainer["fp32 matmuls"].value == "TF32" and trainer["communication overlap"].value == "on"
    cpu = resolve(["recipe=tiny_sft"])
    assert performance_settings(cpu.recipe, cpu.plan)[0].value == "full fp32"
