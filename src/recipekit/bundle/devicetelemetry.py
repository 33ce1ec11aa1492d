"""Device telemetry for the bundle's dashboard and alerts, from the exporters clusters already run: MindCluster's NPU
exporter on Ascend, NVIDIA's DCGM exporter on GPUs. Pure data and PromQL; no I/O.

Both exporters label each device's series with the pod that holds it, which joins a device to this Job's pods
(``<job>-<task>-<index>``, the svc plugin's names):

* npu-exporter (Ascend/mind-cluster ``component/npu-exporter``, v6 module path, read late 2026): every chip series
  carries ``id, model_name, v_dev_id, pcie_bus_info, namespace, pod_name, container_name``
  (``collector/common`` ``CardLabel``); ``npu_chip_info_health_status`` is 1 healthy / 0 unhealthy,
  ``npu_chip_info_link_status`` 1 up / 0 down (``getHealthCode``, ``getLinkStatusCode``); HBM figures in MB.
* dcgm-exporter (NVIDIA/dcgm-exporter ``etc/default-counters.csv``): ``gpu, UUID, device, modelName, Hostname`` and,
  with its Kubernetes mapping on, ``namespace, pod, container``. The ECC and NVLink error counters are commented out
  in the default counters file: the exporter must be given a counters file that enables them.

Which exporter applies follows ``hw.vendor``; a CPU run gets neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recipekit.runtime.boundary.metricnames import Metric


@dataclass(frozen=True)
class Exporter:
    """One device exporter: its pod label, device label, and the metrics the bundle queries."""

    name: str
    pod_label: str
    device_label: str
    metrics: tuple[Metric, ...]


NPU_HBM_USED = Metric("npu_chip_info_hbm_used_memory", "HBM in use per NPU (MB).", "decmbytes")
NPU_TEMPERATURE = Metric("npu_chip_info_temperature", "NPU temperature (°C).", "celsius")
NPU_HEALTH = Metric("npu_chip_info_health_status", "NPU health: 1 healthy, 0 unhealthy.", "none")
NPU_UTILISATION = Metric("npu_chip_info_utilization", "NPU AI Core utilisation (%).", "percent")
NPU_ECC_DOUBLE = Metric(
    "npu_chip_info_hbm_ecc_double_bit_error_cnt", "HBM double-bit (uncorrectable) ECC errors per NPU.", "none"
)
NPU_LINK = Metric("npu_chip_info_link_status", "NPU network port link: 1 up, 0 down.", "none")

GPU_FB_USED = Metric("DCGM_FI_DEV_FB_USED", "Framebuffer memory used per GPU (MiB).", "decmbytes")
GPU_TEMPERATURE = Metric("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (°C).", "celsius")
GPU_XID = Metric("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error of the GPU (0: none).", "none")
GPU_UTILISATION = Metric("DCGM_FI_DEV_GPU_UTIL", "GPU utilisation (%).", "percent")
GPU_ECC_DOUBLE = Metric(
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Double-bit volatile ECC errors per GPU.", "none", kind="counter"
)
GPU_NVLINK_RECOVERY = Metric(
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "NVLink recovery errors per GPU (a link went down and came back).",
    "none",
    kind="counter",
)

NPU_EXPORTER = Exporter(
    "npu-exporter",
    "pod_name",
    "id",
    (NPU_HBM_USED, NPU_TEMPERATURE, NPU_UTILISATION, NPU_HEALTH, NPU_ECC_DOUBLE, NPU_LINK),
)
DCGM_EXPORTER = Exporter(
    "dcgm-exporter",
    "pod",
    "gpu",
    (GPU_FB_USED, GPU_TEMPERATURE, GPU_UTILISATION, GPU_XID, GPU_ECC_DOUBLE, GPU_NVLINK_RECOVERY),
)
#: Every exporter metric name the bundle may query (a panel or alert on any other name is a bug).
KNOWN_METRICS = frozenset(m.name for e in (NPU_EXPORTER, DCGM_EXPORTER) for m in e.metrics)
#: Minutes an unhealthy or down reading must persist before the alert fires (one missed scrape is no fault).
FOR = "1m"
#: The window over which rising ECC / link error counters are measured.
WINDOW = "10m"


def exporter_for(vendor: str) -> Exporter | None:
    """The exporter that serves a vendor's devices, or None (CPU)."""
    return {"ascend": NPU_EXPORTER, "nvidia": DCGM_EXPORTER}.get(vendor)


def pod_selector(exporter: Exporter, namespace: str, job: str) -> str:
    """The PromQL label matchers that keep a device series held by one of the Job's pods."""
    return f'namespace="{namespace}",{exporter.pod_label}=~"{job}-.+"'


def alert_rules(exporter: Exporter, namespace: str, job: str, job_label: str) -> list[dict[str, Any]]:
    """Alerts on the devices of this Job's pods: unhealthy, ECC errors rising, a link down (or recovering)."""
    sel = pod_selector(exporter, namespace, job)
    where = f"pod {{{{ $labels.{exporter.pod_label} }}}} device {{{{ $labels.{exporter.device_label} }}}}"

    def rule(alert: str, expr: str, severity: str, summary: str, duration: str) -> dict[str, Any]:
        return {
            "alert": alert,
            "expr": expr,
            "for": duration,
            "labels": {"severity": severity, job_label: job},
            "annotations": {"summary": summary, "description": f"{summary} ({where})"},
        }

    if exporter is NPU_EXPORTER:
        return [
            rule(
                "RecipekitDeviceUnhealthy",
                f"{NPU_HEALTH.name}{{{sel}}} == 0",
                "critical",
                "an NPU of the running job is unhealthy (MindCluster isolates it when fault rescheduling is on)",
                FOR,
            ),
            rule(
                "RecipekitDeviceEccErrors",
                f"delta({NPU_ECC_DOUBLE.name}{{{sel}}}[{WINDOW}]) > 0",
                "warning",
                f"HBM double-bit ECC errors rose within {WINDOW} on an NPU of the running job",
                "0m",
            ),
            rule(
                "RecipekitDeviceLinkDown",
                f"{NPU_LINK.name}{{{sel}}} == 0",
                "critical",
                "a network port of an NPU of the running job is down: HCCL traffic through it fails",
                FOR,
            ),
        ]
    return [
        rule(
            "RecipekitDeviceUnhealthy",
            f"{GPU_XID.name}{{{sel}}} > 0",
            "critical",
            "a GPU of the running job reported an XID error",
            "0m",
        ),
        rule(
            "RecipekitDeviceEccErrors",
            f"increase({GPU_ECC_DOUBLE.name}{{{sel}}}[{WINDOW}]) > 0",
            "warning",
            f"double-bit ECC errors rose within {WINDOW} on a GPU of the running job",
            "0m",
        ),
        rule(
            "RecipekitDeviceLinkDown",
            f"increase({GPU_NVLINK_RECOVERY.name}{{{sel}}}[{WINDOW}]) > 0",
            "critical",
            f"an NVLink of a GPU of the running job went down (recovery errors within {WINDOW})",
            "0m",
        ),
    ]


def panels(exporter: Exporter, namespace: str, job_var: str) -> list[tuple[Metric, str, str, str]]:
    """(metric, PromQL, title, legend) of each device panel, for the Job named by the dashboard's ``job_var``."""
    sel = pod_selector(exporter, namespace, job_var)
    legend = f"{{{{{exporter.pod_label}}}}} / {exporter.device_label} {{{{{exporter.device_label}}}}}"
    out = []
    for metric in exporter.metrics:
        expr = f"{metric.name}{{{sel}}}"
        if metric.kind == "counter":
            expr = f"increase({expr}[{WINDOW}])"
        out.append((metric, expr, f"{exporter.name}: {metric.help.rstrip('.')}", legend))
    return out
