"""The operations layer's numbers: timeouts, preflight thresholds, checkpoint sizes and metrics ports, computed once.

Every value here is derived from the recipe's ``ops`` section, the plan and the memory estimate, and then rendered
into the files that need it — recipe.yaml's ``operations`` section (what the runtime's preflight, hang watchdog and
alerts read), launch.json's environment (the collective libraries' timeouts), the Job's container ports and the
monitoring files (:mod:`~recipekit.bundle.monitoring`) — so the watchdog, the collective timeouts and the alert rules
cannot disagree.

It comes after :mod:`recipekit.memory` in the pipeline because the hang watchdog's timeout follows the planned step
time, which is the estimate's. Pure: no I/O.

Timeouts by phase (why they differ):

* **startup** (``cluster.connect_timeout_s``): forming the process group, HCCL/NCCL link setup
  (``HCCL_CONNECT_TIMEOUT``), the first step; loading a large model from shared storage legitimately takes minutes.
* **step** (:attr:`Operations.stall_timeout_s`): between two optimizer steps, ``max(floor, factor × planned step
  time)``; the watchdog's hang timeout once training runs.
* **steady** (:attr:`Operations.steady_timeout_s`): what a rank may wait inside a collective for its peers once
  training runs: one stalled step or one checkpoint save (rank 0 writes while the others wait in a barrier, the case
  CANN documents for ``HCCL_EXEC_TIMEOUT``), ``max(stall timeout, 2 × ops.checkpoint_save_limit_s)``. It becomes
  ``HCCL_EXEC_TIMEOUT`` (A2/A3 accept 0-2147483647 s; 1091 s at most in HCCL's AIV expansion mode), the process
  group's timeout after the first step, and the watchdog's allowance while a checkpoint is saved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from recipekit.memory import Estimate
from recipekit.memory.breakdown import plan_regime
from recipekit.memory.formulas import HALF
from recipekit.plan.ops import metrics_ports, steady_timeout_floor_s
from recipekit.plan.plan import Plan
from recipekit.recipe.sections import Recipe
from recipekit.runtime.boundary import recipeview

#: Free space preflight wants beyond the checkpoints and the final model (logs, metrics, traces, the data cache).
STORAGE_MARGIN = 1.1


@dataclass(frozen=True)
class Operations:
    """The numbers of the operations layer for one recipe and plan."""

    planned_step_time_s: float
    startup_timeout_s: int
    stall_timeout_s: int
    steady_timeout_s: int
    checkpoint_bytes: int  # one Trainer checkpoint: weights and optimizer states, all ranks together
    final_model_bytes: int
    storage_needed_bytes: int  # save_total_limit + 1 checkpoints (one is written before the oldest goes) + final
    link: str
    link_gbps: float
    bandwidth_warn_gbps: float
    mfu_target: float
    burn_in_tflops: float  # the achieved TFLOP/s per device the plan assumes: burn-in's bar on a device
    metrics_ports: tuple[int, ...]  # local rank i serves on metrics_ports[i] ("rank0": one port)
    env: dict[str, str]  # added to launch.json's environment where the plan and hw.env leave the key unset
    expected_versions: dict[str, str]
    collective_hint: str

    @property
    def metrics(self) -> bool:
        return bool(self.metrics_ports)


# ----------------------------------------------------------------------------------------------------- numbers
def checkpoint_sizes(recipe: Recipe, plan: Plan) -> tuple[int, int]:
    """Bytes of one checkpoint and of the final model, from the parameter counts and the plan's byte widths.

    A checkpoint holds the weights as the run stores them (16-bit under DeepSpeed, fp32 under DDP's AMP; LoRA: the
    adapter only) and the optimizer states of every trainable parameter (fp32 master where there is one, Adam's two
    moments). The final model is the weights alone, plus the merged 16-bit model for ``lora.merge_on_save``.
    """
    reg = plan_regime(recipe, plan)
    total, trainable = plan.flops.params_total, plan.flops.params_trainable
    lora = getattr(recipe.mode, "lora", None)
    saved_weights = trainable * reg.weight if lora is not None else total * reg.weight
    checkpoint = saved_weights + trainable * reg.optimizer
    final = saved_weights + (total * HALF if lora is not None and lora.merge_on_save else 0)
    return int(checkpoint), int(final)


def expected_versions(recipe: Recipe, plan: Plan) -> dict[str, str]:
    """The versions the bundle's image pins, for preflight to compare with what each pod runs."""
    family = plan.family
    versions = {"torch": family.torch}
    if family.torch_npu:
        versions["torch_npu"] = family.torch_npu
    if family.cann:
        versions["cann"] = family.cann
    wanted = ["transformers"] + (["deepspeed"] if plan.uses_deepspeed else [])
    wanted += ["peft"] if recipeview.trains_adapter(recipe.mode.kind) else []
    versions.update({name: family.packages[name] for name in wanted if name in family.packages})
    return versions


def collective_hint(recipe: Recipe, plan: Plan) -> str:
    """What to check when a collective does not complete: the bundle README's advice in one line (preflight prints
    it when its all-reduce times out; the README renders the same text)."""
    hw, cl = recipe.hw, recipe.cluster
    common = f"check that {plan.master_host} resolves from every pod and port {plan.master_port} is reachable"
    if hw.comm_backend == "hccl":
        return (
            f"{common}, that HCCL's ports 60000-60015 are open between nodes, that `npu-smi info` lists this pod's "
            "NPUs as healthy and that no stale process holds them, and set the NIC with "
            f"cluster.socket_ifname=<nic> (HCCL_SOCKET_IFNAME{', now ' + cl.socket_ifname if cl.socket_ifname else ''})"
        )
    if hw.comm_backend == "nccl":
        return (
            f"{common}, rerun with NCCL_DEBUG=INFO to see the transport NCCL picks (IB/RoCE or sockets), check that "
            "the pod sees its InfiniBand/RoCE devices, and set the NIC with cluster.socket_ifname=<nic> "
            f"(NCCL_SOCKET_IFNAME{', now ' + cl.socket_ifname if cl.socket_ifname else ''})"
        )
    return f"{common}, and set the NIC with cluster.socket_ifname=<nic> (GLOO_SOCKET_IFNAME)"


def operations(recipe: Recipe, plan: Plan, estimate: Estimate) -> Operations:
    """The operations layer's numbers for ``recipe`` laid out as ``plan``, timed by ``estimate``."""
    ops, hw, layout = recipe.ops, recipe.hw, plan.layout
    step = estimate.step_time_s
    stall = max(ops.stall_timeout_floor_s, math.ceil(ops.stall_timeout_factor * step))
    steady = max(stall, steady_timeout_floor_s(ops))
    startup = recipe.cluster.connect_timeout_s
    checkpoint, final = checkpoint_sizes(recipe, plan)
    needed = math.ceil(((recipe.train.save_total_limit + 1) * checkpoint + final) * STORAGE_MARGIN)
    across = layout.nodes > 1
    link = hw.inter_node_link if across else hw.intra_node_link
    gbps = hw.inter_node_gbps if across else hw.intra_node_gbps
    target = ops.mfu_target or estimate.compute.mfu
    ports = metrics_ports(ops, layout)

    env: dict[str, str] = {}
    if hw.comm_backend == "hccl":
        env["HCCL_EXEC_TIMEOUT"] = str(steady)  # AIV mode's cap is plan.operations_problems' warning
    elif hw.comm_backend == "nccl":
        # Abort a timed-out collective and crash the process (the pod fails, Volcano restarts the job) instead of
        # hanging; the heartbeat monitor does the same for a stuck NCCL watchdog thread after one stall timeout.
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
        env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] = str(stall)
    return Operations(
        planned_step_time_s=step,
        startup_timeout_s=startup,
        stall_timeout_s=stall,
        steady_timeout_s=steady,
        checkpoint_bytes=checkpoint,
        final_model_bytes=final,
        storage_needed_bytes=needed,
        link=link,
        link_gbps=gbps,
        bandwidth_warn_gbps=ops.bandwidth_warn_fraction * gbps,
        mfu_target=target,
        burn_in_tflops=plan.flops.peak_tflops * target,
        metrics_ports=ports,
        env=env,
        expected_versions=expected_versions(recipe, plan),
        collective_hint=collective_hint(recipe, plan),
    )
