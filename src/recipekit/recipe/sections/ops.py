"""The ``ops`` section: preflight, the hang watchdog, metrics and alerts, and (testing only) injected faults."""

from __future__ import annotations

from typing import Literal

from recipekit.recipe.domains import (
    IP_ADDRESS,
)
from recipekit.recipe.schema import Section, spec


# ----------------------------------------------------------------------------------------------------------- ops
class OpsTestingSpec(Section):
    """Fault injection — TESTING ONLY. Each switch breaks the run on purpose, once per output directory (a marker
    file there keeps the restarted job from breaking again), so that a drill or the dry run can prove that the
    operations layer notices and recovers. Never set these in a production recipe: ``build`` warns when any is set.
    """

    stall_rank: int = spec(0, ge=0, description="TESTING ONLY: the global rank that stalls (with stall_at_step).")
    stall_at_step: int | None = spec(
        None,
        ge=2,
        description="TESTING ONLY: stall_rank blocks forever when it begins this optimizer step (from 2: step 1 "
        "is covered by the startup timeouts), so the hang watchdog must detect it and the job restart.",
    )
    nan_at_step: int | None = spec(
        None, ge=1, description="TESTING ONLY: the loss of this optimizer step becomes NaN on every rank."
    )
    spike_rank: int = spec(0, ge=0, description="TESTING ONLY: the global rank whose loss spikes (with spike_at_step).")
    spike_at_step: int | None = spec(
        None,
        ge=2,
        description="TESTING ONLY: spike_rank's loss of this optimizer step is ten times what it was (from 2: a spike "
        "is a rise over the step before), so the loss-spike alert must fire and its report name that rank's batch.",
    )
    device_count: int | None = spec(
        None,
        ge=0,
        description="TESTING ONLY: preflight's device check sees this many devices instead of asking the driver "
        "(simulates a pod given the wrong number of devices; also on CPU).",
    )
    device_count_pod: int | None = spec(
        None,
        ge=0,
        description="TESTING ONLY: with device_count, only this pod (its Volcano task index) sees the wrong count, "
        "and only once per output directory: one faulty node, healed by a restart elsewhere (exit code preflight).",
    )
    user_error_pod: int | None = spec(
        None,
        ge=0,
        description="TESTING ONLY: this pod's processes stop before training with the configuration-error exit code "
        "(user_error), as a pod given a broken configuration would; never healed, so the Job must end unretried.",
    )
    record_rows: bool = spec(
        False,
        description="TESTING ONLY: every rank writes the row indices of each micro-batch it trains on to "
        "<output_dir>/rows/rank-R.jsonl, so a resume (also at another world size) can be checked sample by sample. "
        "Prepared data only (not data.streaming).",
    )


class OpsSpec(Section):
    """The operations layer every bundle carries: preflight checks, the hang watchdog and collective timeouts,
    metrics for Prometheus, and alert thresholds. Defaults are the operators' own; derived numbers (stall and
    collective timeouts, checkpoint sizes, bandwidth floors) are computed by recipekit.memory.operations from these."""

    preflight: Literal["strict", "warn", "off", True, False] = spec(
        "warn",
        description="Check devices, versions, shared storage and its throughput, the collective and every "
        "point-to-point link on every pod before training. A failed check stops the pods (exit preflight, "
        "RestartJob) in either mode; strict also ends the Job (exit preflight_gate, TerminateJob) on what warn only "
        "warns about: a slow node or link, a volume too slow for the checkpoint, a device error counter, a node "
        "failing burn-in. off: no preflight. true means warn and false off (YAML reads an unquoted off as false).",
    )
    preflight_timeout_s: int = spec(
        120, ge=10, le=3600, description="Preflight's collectives must finish within this; past it the pod fails."
    )
    allreduce_sizes_mb: list[float] = spec(
        default_factory=lambda: [1.0, 16.0, 256.0],
        description="Message sizes (MB) of preflight's all-reduce bandwidth test; the largest is held to the floor.",
    )
    allreduce_iterations: int = spec(10, ge=1, le=1000, description="Timed all-reduces per size (after 2 warm-ups).")
    bandwidth_warn_fraction: float = spec(
        0.5,
        gt=0,
        le=1,
        description="Warn when the all-reduce bus bandwidth is below this fraction of the hardware's link bandwidth "
        "(hw.inter_node_gbps across nodes, hw.intra_node_gbps within one).",
    )
    p2p_size_mb: float = spec(
        64.0,
        gt=0,
        le=4096,
        description="Message size (MB) of preflight's point-to-point test: each round pairs every rank with one "
        "other (rank XOR k) and both send this much to each other at once.",
    )
    p2p_iterations: int = spec(
        3, ge=1, le=100, description="Timed exchanges per pair of the point-to-point test; the fastest counts."
    )
    p2p_max_rounds: int = spec(
        16,
        ge=1,
        le=1024,
        description="Rounds of the point-to-point test at most (every pair needs world size − 1 rounds; beyond "
        "this the rounds that cross nodes are taken first, so a slow node is always found, a slow link mostly).",
    )
    p2p_slow_fraction: float = spec(
        0.5,
        gt=0,
        lt=1,
        description="A point-to-point pair is slow below this fraction of the median pair's bandwidth; a rank all "
        "of whose pairs are slow names its node, a slow pair between healthy ranks names the link.",
    )
    storage_probe_mb: int = spec(
        256,
        ge=1,
        le=65536,
        description="Bytes (MB) each pod writes to the shared volume and reads back (sequential, synced, the page "
        "cache dropped) to measure its throughput; the checkpoint's time follows from it.",
    )
    burn_in_s: int = spec(
        0,
        ge=0,
        le=86400,
        description="Opt-in burn-in before training: this many seconds of matmuls and all-reduces on every rank, "
        "with a per-node verdict (its rate against the plan's and against the other nodes'); 0: none.",
    )
    burn_in_slow_fraction: float = spec(
        0.8,
        gt=0,
        lt=1,
        description="Burn-in names a node whose matmul rate is below this fraction of the median node's (or, on a "
        "device, of the rate the plan expects).",
    )
    stall_timeout_floor_s: int = spec(
        300, ge=10, description="The hang watchdog's timeout is never shorter than this, seconds."
    )
    stall_timeout_factor: float = spec(
        10.0,
        ge=1,
        description="The hang watchdog fires when no optimizer step completes within this many planned step times "
        "(the plan's estimate), or the floor, whichever is longer.",
    )
    metrics_port: int | None = spec(
        9400,
        ge=1024,
        le=65535,
        description="Serve Prometheus metrics on this port (a process with local rank i uses port + i); null: off.",
    )
    metrics_bind: str = spec(
        "0.0.0.0",
        domain=IP_ADDRESS,
        description="Address the metrics endpoint listens on. 0.0.0.0 (every interface of the pod's own network "
        "namespace) is what Prometheus needs: it scrapes the pod IP. Choose 127.0.0.1 where the host's network is "
        "shared (hostNetwork, a bare-metal run) and a local agent scrapes; :: for IPv6.",
    )
    metrics_ranks: Literal["rank0", "all"] = spec(
        "all", description="Which processes serve metrics: global rank 0 only, or every rank (per-device figures)."
    )
    monitor_labels: dict[str, str] = spec(
        default_factory=dict,
        description="Labels on the PodMonitor and PrometheusRule, for the Prometheus that selects them "
        "(kube-prometheus-stack: release: <its release name>).",
    )
    loss_spike_ratio: float = spec(
        0.3, gt=0, description="Warn when the loss rises by more than this fraction from one logged step to the next."
    )
    grad_norm_jump_ratio: float = spec(
        0.3,
        gt=0,
        description="Warn when the gradient norm changes by more than this fraction, either way, in one logged step.",
    )
    mfu_target: float | None = spec(
        None,
        gt=0,
        le=1,
        description="Warn when MFU stays below this for mfu_low_steps; null: the step's MFU the plan predicts "
        "(hw.assumed_mfu in recipekit's count, lower where the layout cannot reach it).",
    )
    mfu_low_steps: int = spec(20, ge=1, description="Logged steps in a row below mfu_target before the warning.")
    checkpoint_save_limit_s: int = spec(
        600, gt=0, description="Warn when saving a checkpoint takes longer, seconds (twice this is a hang)."
    )
    mttr_limit_s: int = spec(
        300,
        gt=0,
        description="Alert (PrometheusRule) when the last recovery took longer than this, seconds: MTTR, from the "
        "last step before an interruption to the first step after the restart (recipekit runs history).",
    )
    log_event_window_s: int = spec(
        900,
        gt=0,
        description="Alert (PrometheusRule) for this long after a rank's log or fatal error named an HCCL/NCCL "
        "timeout, an ECC error or Xid, or a device out of memory (recipekit_log_event_timestamp_seconds).",
    )
    device_utilisation_min: float = spec(
        0.5, ge=0, le=1, description="Warn when the device's utilisation (driver's figure) stays below this."
    )
    nonfinite_loss: Literal["stop", "skip", "warn"] = spec(
        "stop",
        description="A NaN/inf loss: stop (no checkpoint of the broken weights; the offending step's batches and a "
        "report are saved in nonfinite-step-N/; the pods exit nonfinite and the Job's policy ends the Job: "
        "TerminateJob), skip (the same, but the Job restarts and the resume skips that step's batch, said in the "
        "run's recovery record) or only warn.",
    )
    testing: OpsTestingSpec = spec(default_factory=OpsTestingSpec, description="Fault injection: TESTING ONLY.")

    @property
    def preflight_mode(self) -> str:
        """``preflight`` as one of strict, warn, off (true is warn, false off)."""
        if isinstance(self.preflight, bool):
            return "warn" if self.preflight else "off"
        return self.preflight

    def rules(self) -> list[str]:
        broken = []
        sizes = self.allreduce_sizes_mb
        if not sizes or any(size <= 0 or size > 16384 for size in sizes):
            broken.append(f"allreduce_sizes_mb {sizes}: one or more sizes, each above 0 and at most 16384 MB")
        return broken
