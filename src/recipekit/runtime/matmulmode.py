"""Reduced-precision fp32 matmuls, enabled at start from the recipe (``recipe.hw.fp32_matmul``), not guessed.

The plan's peak and MFU assume the device's fast fp32 path: HF32 on Ascend (torch_npu's
``torch.npu.matmul.allow_hf32`` and ``torch.npu.conv.allow_hf32``; the conv switch is on by default, the matmul one
off), TF32 on NVIDIA Ampere and later (``torch.backends.cuda.matmul.allow_tf32`` and
``torch.backends.cudnn.allow_tf32``). bf16 and fp16 matmuls are unaffected; what runs in fp32 (the loss, fp32
main-gradient arithmetic) takes the faster path. Both rooms call :func:`apply` once the device is found. Where the
recipe's device is not the one this process runs on (the CPU dry run), nothing is set and the line says so.
"""

from __future__ import annotations

from typing import Any

#: recipe.hw.fp32_matmul -> the torch device type it belongs to.
MODES = {"hf32": "npu", "tf32": "cuda"}


def apply(mode: str | None, torch_module: Any = None) -> str:
    """Enable ``mode`` (``hf32``, ``tf32`` or None) on this process's device; one line saying what was done."""
    if mode is None:
        return "fp32 matmuls: full precision (recipe.hw.fp32_matmul unset)"
    device = MODES.get(mode)
    if device is None:
        return f"fp32 matmuls: unknown mode {mode!r} left unset (allowed: {', '.join(MODES)})"
    import torch

    torch = torch_module or torch
    backend = getattr(torch, device, None)
    if backend is None or not backend.is_available():
        return f"fp32 matmuls: {mode} not set, no {device} device in this process"
    if mode == "hf32":
        backend.matmul.allow_hf32 = True
        backend.conv.allow_hf32 = True
        return "fp32 matmuls: hf32 (torch.npu.matmul.allow_hf32, torch.npu.conv.allow_hf32)"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return "fp32 matmuls: tf32 (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)"
