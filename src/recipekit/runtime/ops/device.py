"""The device the bundle was built for, found or refused, before anything heavy is imported.

The bundle knows its target (recipe.yaml ``recipe.hw.torch_device``: npu, cuda or cpu), so there is nothing to guess:
a process that cannot reach that device stops at once with one line saying why (exit 2), rather than training on the
CPU by accident or dying later in a library. The check must come before transformers is imported: transformers
probes for torch_npu on its own, and a broken torch_npu (CANN not sourced, driver not mounted) then kills the import
with a long traceback that hides the cause. So this module imports only the standard library; torch and torch_npu
are imported inside :func:`detect`, where their failure is caught.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..boundary.common import RunError
from ..boundary.recipeview import DEVICE_TARGETS as TARGETS
from ..boundary.recipeview import HardwareView


class DeviceError(RunError):
    """The target device is not usable in this process (exit 2)."""


@dataclass(frozen=True)
class Device:
    """The device this process trains on."""

    kind: str  # npu | cuda | cpu: torch's device type
    count: int  # devices of that kind visible to this process (0 for cpu)


def detect(hw: HardwareView) -> Device:
    """The bundle's target device (``hw`` is recipe.yaml's ``recipe.hw``), or a DeviceError naming what is missing."""
    target = hw.torch_device
    if target == "cpu":
        return Device("cpu", 0)
    if target == "npu":
        return _check_local_rank(Device("npu", _npu_count(hw)), hw)
    if target == "cuda":
        return _check_local_rank(Device("cuda", _cuda_count(hw)), hw)
    raise DeviceError(f"recipe.hw.torch_device is {target!r}: expected one of {', '.join(TARGETS)}")


def _visible(hw: HardwareView) -> str:
    name = hw.visible_devices_env
    return (
        f"{name}={os.environ[name]!r}" if name and name in os.environ else f"{name or 'the visible-devices env'} unset"
    )


def _npu_hint(hw: HardwareView) -> str:
    mounts = [m for m in hw.host_mounts if "driver" in m] or ["/usr/local/Ascend/driver"]
    return (
        "run.sh sources CANN's set_env.sh, so start the pod through run.sh; the pod must mount the driver "
        f"({', '.join(mounts)}) and request {hw.device_resource or 'NPUs'}; "
        f"{hw.visible_devices_env or 'ASCEND_RT_VISIBLE_DEVICES'} must name visible devices "
        f"({_visible(hw)})"
    )


def _npu_count(hw: HardwareView) -> int:
    """NPUs torch_npu sees. Anything raised while importing it (ImportError, an OSError of a missing CANN library,
    a RuntimeError from torch's backend autoload) is the cause to report, in one line."""
    try:
        import torch
        import torch_npu  # noqa: F401  (registers torch.npu)

        count = int(torch.npu.device_count()) if torch.npu.is_available() else 0
    except Exception as exc:  # noqa: BLE001 - whatever a broken installation raises is the message
        detail = _describe(exc)
        raise DeviceError(
            f"this bundle targets Ascend NPUs ({hw.name}) but torch_npu does not load ({detail}): {_npu_hint(hw)}"
        ) from None
    if count == 0:
        raise DeviceError(f"this bundle targets Ascend NPUs ({hw.name}) but torch_npu sees none: {_npu_hint(hw)}")
    return count


def _describe(exc: BaseException) -> str:
    """``Type: message`` on one line, with the cause torch's backend autoload wraps its failure around."""
    text = f"{type(exc).__name__}: {exc}"
    if exc.__cause__ is not None:
        text += f" (caused by {type(exc.__cause__).__name__}: {exc.__cause__})"
    return " ".join(text.split())


def _cuda_count(hw: HardwareView) -> int:
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise DeviceError(
            f"this bundle targets CUDA GPUs ({hw.name}) but torch sees none (torch {torch.__version__}, CUDA build "
            f"{torch.version.cuda or 'none'}; {_visible(hw)}): the pod must request "
            f"{hw.device_resource or 'GPUs'} on a node with the NVIDIA driver and device plugin"
        )
    return count


def _check_local_rank(device: Device, hw: HardwareView) -> Device:
    """torchrun starts devices_per_pod processes; each takes the device of its LOCAL_RANK, which must exist."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if local_rank >= device.count:
        raise DeviceError(
            f"local rank {local_rank} needs a {device.kind} device {local_rank}, but {device.count} are visible "
            f"({_visible(hw)}): the pod requests fewer {hw.device_resource or 'devices'} than the "
            "bundle starts processes"
        )
    return device
