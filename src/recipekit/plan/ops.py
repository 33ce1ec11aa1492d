"""The operations layer's rules that need more than the ``ops`` section, and the numbers the plan owns for it: the
tracker settings no tracker reads, the metrics ports against the rendezvous port, the floor of the steady timeout, the
profiling window and the fault-injection switches against the schedule and the world.
"""

from __future__ import annotations

from recipekit.base.errors import Problem
from recipekit.plan.layout import Layout
from recipekit.recipe.sections import TRACKERS, OpsSpec, Recipe, TrackingSpec

#: HCCL_EXEC_TIMEOUT's ceiling when HCCL expands collectives on the AI vector cores (HCCL_OP_EXPANSION_MODE=AIV).
HCCL_AIV_EXEC_TIMEOUT_MAX_S = 1091


def steady_timeout_floor_s(ops: OpsSpec) -> int:
    """The least the steady timeout (a collective's wait once training runs) can be, whatever the step time: the
    stall floor, and room for a rank to wait out a peer's checkpoint save twice over."""
    return max(ops.stall_timeout_floor_s, 2 * ops.checkpoint_save_limit_s)


def metrics_ports(ops: OpsSpec, layout: Layout) -> tuple[int, ...]:
    """The ports a pod serves metrics on (``ops.metrics_port`` up): one per process with ``ops.metrics_ranks: all``,
    the first process's alone with ``rank0``; none without a metrics port."""
    if ops.metrics_port is None:
        return ()
    count = layout.devices_per_pod if ops.metrics_ranks == "all" else 1
    return tuple(ops.metrics_port + i for i in range(count))


def operations_problems(recipe: Recipe, layout: Layout, total_steps: int | None) -> tuple[list[Problem], list[str]]:
    """Rules of the operations layer that need more than the ``ops`` section: trackers, the metrics ports against
    the rendezvous port, the profiling window and the fault-injection switches against the schedule and the world."""
    ops, tr, problems, warnings = recipe.ops, recipe.train, [], []
    if tr.tracking != TrackingSpec() and not set(tr.report_to) & set(TRACKERS):
        warnings.append(f"train.tracking is set, but train.report_to lists none of {', '.join(TRACKERS)}")
    ports = metrics_ports(ops, layout)
    if ports:
        last = ports[-1]
        if last > 65535:
            problems.append(Problem("ops.metrics_port", f"{ports[0]} + {len(ports)} processes passes 65535"))
        if ports[0] <= recipe.cluster.master_port <= last:
            problems.append(
                Problem(
                    "ops.metrics_port",
                    f"ports {ops.metrics_port}-{last} (one per process) include cluster.master_port "
                    f"{recipe.cluster.master_port}",
                    hint="choose another ops.metrics_port",
                )
            )
        if ops.metrics_bind.startswith("127.") or ops.metrics_bind == "::1":
            warnings.append(
                f"ops.metrics_bind is {ops.metrics_bind}: only a scraper on the pod's own host network reaches the "
                "metrics; the PodMonitor scrapes the pod IP and will find its targets down"
            )
    steady_floor = steady_timeout_floor_s(ops)
    if recipe.hw.env.get("HCCL_OP_EXPANSION_MODE") == "AIV" and steady_floor > HCCL_AIV_EXEC_TIMEOUT_MAX_S:
        warnings.append(
            f"HCCL_EXEC_TIMEOUT will be at least {steady_floor} s, but HCCL's AIV expansion mode caps it at "
            f"{HCCL_AIV_EXEC_TIMEOUT_MAX_S} s: a checkpoint save longer than that fails the waiting ranks' collective"
        )
    if tr.profile_steps is not None and total_steps and tr.profile_steps[1] > total_steps:
        warnings.append(f"train.profile_steps {list(tr.profile_steps)} ends after the last step ({total_steps})")
    testing = ops.testing
    for name in ("stall_rank", "spike_rank"):
        rank = getattr(testing, name)
        if rank >= layout.world_size:
            problems.append(Problem(f"ops.testing.{name}", f"{rank}, but ranks are 0..{layout.world_size - 1}"))
    for name in ("device_count_pod", "user_error_pod"):
        pod = getattr(testing, name)
        if pod is not None and pod >= layout.nodes:
            problems.append(Problem(f"ops.testing.{name}", f"{pod}, but pods are 0..{layout.nodes - 1}"))
    injected = [
        f"{name}={value}"
        for name, value in (
            ("stall_at_step", testing.stall_at_step),
            ("nan_at_step", testing.nan_at_step),
            ("spike_at_step", testing.spike_at_step),
            ("device_count", testing.device_count),
            ("user_error_pod", testing.user_error_pod),
            ("record_rows", testing.record_rows or None),
        )
        if value is not None
    ]
    if injected:
        warnings.append(f"ops.testing sets {', '.join(injected)}: this bundle injects faults (testing only)")
    return problems, warnings
