"""Preflight: the checks every pod runs before training (checks.py), the node's own facts they compare
(nodefacts.py), and the measurements that find a slow part: the point-to-point matrix (p2p.py), the shared volume's
throughput (volumeprobe.py) and the opt-in burn-in (burnin.py)."""

from .checks import (
    PreflightFailed,
    PreflightGate,
    bus_bandwidth,
    judge_bandwidth,
    judge_devices,
    judge_p2p,
    judge_storage,
    judge_versions,
    make_output_dir,
    run_preflight,
    storage_read,
    storage_write,
    table,
)
from .nodefacts import (
    device_facts,
    local_rank,
    npu_smi_health,
    nvidia_counters,
    pod_index,
    public,
    software_versions,
)

__all__ = [
    "PreflightFailed",
    "PreflightGate",
    "bus_bandwidth",
    "device_facts",
    "judge_bandwidth",
    "judge_devices",
    "judge_p2p",
    "judge_storage",
    "judge_versions",
    "local_rank",
    "make_output_dir",
    "npu_smi_health",
    "nvidia_counters",
    "pod_index",
    "public",
    "run_preflight",
    "software_versions",
    "storage_read",
    "storage_write",
    "table",
]
