"""What a node is, read on the node itself: its pod index, the versions of its software stack (torch, torch_npu,
CANN, the Ascend driver and firmware, CUDA, NCCL, the NVIDIA driver) and its devices' health (npu-smi, nvidia-smi
error counters), parsed defensively and bounded. Preflight (checks.py) gathers these from every pod and compares them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from ...boundary.common import version

GIB = 1024**3


# --------------------------------------------------------------------------------------------------- local facts
def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def pod_index() -> int:
    """This pod's index: torchrun's node rank (GROUP_RANK), Volcano's task index, else 0."""
    for name in ("GROUP_RANK", "VC_TASK_INDEX", "NODE_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def public(text: str) -> str:
    """A version without its local part (``2.13.0+cpu`` → ``2.13.0``): builds of one release compare equal."""
    return text.split("+", 1)[0]


def _read_key(path: Path, key: str) -> str | None:
    try:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            name, sep, value = line.partition("=")
            if sep and name.strip().lower() == key.lower():
                return value.strip().strip('"')
    except OSError:
        return None
    return None


def ascend_versions() -> dict[str, str]:
    """CANN's and the Ascend driver's versions from their install records (absent where they are not installed)."""
    found: dict[str, str] = {}
    driver = _read_key(Path("/usr/local/Ascend/driver/version.info"), "Version")
    if driver:
        found["ascend_driver"] = driver
    firmware = _read_key(Path("/usr/local/Ascend/firmware/version.info"), "Version")
    if firmware:
        found["ascend_firmware"] = firmware
    for variable in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"):
        home = os.environ.get(variable)
        if not home:
            continue
        for info in sorted(Path(home).glob("*-linux/ascend_toolkit_install.info")):
            cann = _read_key(info, "version")
            if cann:
                found["cann"] = cann
                return found
    return found


def nvidia_driver() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def software_versions(kind: str) -> dict[str, str]:
    """What this process runs: the Python stack and, per vendor, the runtime and driver versions."""
    found = {"python": sys.version.split()[0], "torch": torch.__version__}
    for package in ("transformers", "deepspeed", "peft", "torch_npu"):
        installed = version(package)
        if installed != "?":
            found[package] = installed
    if kind == "npu":
        found.update(ascend_versions())
    if kind == "cuda":
        found["cuda"] = str(torch.version.cuda)
        driver = nvidia_driver()
        if driver:
            found["nvidia_driver"] = driver
        try:
            found["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - a build without NCCL has no version to compare
            pass
    return found


#: NVIDIA's error counters preflight reads (``nvidia-smi --help-query-gpu``): uncorrectable ECC errors since the
#: driver loaded, and retired pages / remapped rows waiting for a reset (the device must be reset before training).
NVIDIA_COUNTERS = ("ecc.errors.uncorrected.volatile.total", "retired_pages.pending", "remapped_rows.pending")
#: Bytes of nvidia-smi's answer read at most (one line per GPU).
SMI_OUTPUT_MAX = 64 * 1024


def nvidia_counters(text: str) -> list[tuple[str, str, int]]:
    """(GPU index, counter, value) of every counter above zero in ``nvidia-smi --query-gpu=index,<counters>
    --format=csv,noheader,nounits`` output; "[N/A]", "[Not Supported]", "No"/"Yes" and malformed rows are read
    defensively (only a count or Yes counts)."""
    found = []
    for line in text[:SMI_OUTPUT_MAX].splitlines()[:64]:
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 1 + len(NVIDIA_COUNTERS) or not cells[0].isdigit():
            continue
        for name, cell in zip(NVIDIA_COUNTERS, cells[1:]):
            value = 1 if cell.lower() == "yes" else int(cell) if cell.isdigit() and len(cell) < 12 else 0
            if value > 0:
                found.append((cells[0], name, value))
    return found


def _nvidia_smi() -> dict[str, Any]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"skipped": "nvidia-smi not found"}
    query = f"--query-gpu=index,{','.join(NVIDIA_COUNTERS)}"
    try:
        out = subprocess.run([smi, query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"skipped": f"nvidia-smi: {exc}"}
    if out.returncode != 0:
        return {"skipped": f"nvidia-smi exited {out.returncode}"}
    return {"counters": nvidia_counters(out.stdout)}


_NPU_ROW = re.compile(r"^\|\s*(\d+)\s+(\S+)\s*\|\s*([A-Za-z]+)\s*\|")


def npu_smi_health(text: str) -> list[tuple[str, str]]:
    """(NPU id, health) of each NPU ``npu-smi info`` lists (its first table: ``| 0  910B3 | OK | ...``)."""
    rows = []
    for line in text.splitlines():
        match = _NPU_ROW.match(line)
        if match:
            rows.append((match.group(1), match.group(3)))
    return rows


def device_facts(kind: str, count: int, simulated: int | None, runtime_context_gib: float) -> dict[str, Any]:
    """This process's view of its devices: how many it sees, whether its own is free of other processes."""
    facts: dict[str, Any] = {"kind": kind, "visible": simulated if simulated is not None else count}
    facts["simulated"] = simulated is not None
    if kind not in ("npu", "cuda"):
        return facts
    module = getattr(torch, kind)
    index = local_rank()
    try:
        free, total = module.mem_get_info(index)
        ours = module.memory_reserved(index)
        held = (total - free - ours) / GIB - runtime_context_gib
        facts.update(device=index, used_gib=round((total - free) / GIB, 2), held_by_others_gib=round(held, 2))
    except Exception as exc:  # noqa: BLE001 - any driver error is the finding
        facts["memory_error"] = f"{type(exc).__name__}: {exc}"
    if kind == "npu" and local_rank() == 0:
        facts["health"] = _npu_smi()
    if kind == "cuda" and local_rank() == 0:
        facts["health"] = _nvidia_smi()
    return facts


def _npu_smi() -> dict[str, Any]:
    smi = shutil.which("npu-smi")
    if smi is None:
        return {"skipped": "npu-smi not found (hw.host_mounts mounts it from the host)"}
    try:
        out = subprocess.run([smi, "info"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"npu-smi info: {exc}"}
    if out.returncode != 0:
        return {"error": f"npu-smi info exited {out.returncode}: {' '.join(out.stderr.split())[:200]}"}
    return {"npus": npu_smi_health(out.stdout)}
