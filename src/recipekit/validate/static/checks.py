"""Static checks of a bundle directory: the registry of checks, in report order, and the runner.

Each check is a function ``(Bundle) -> Result`` from a module with one job — :mod:`~recipekit.validate.static.structure`
(files parse, manifest hashes, the Volcano Job), :mod:`~recipekit.validate.static.consistency` (the files agree with
each other and the hardware), :mod:`~recipekit.validate.static.image.pins` (base image and pins),
:mod:`~recipekit.validate.static.linters` (shellcheck, hadolint). :data:`CHECKS` lists them in the order they are
reported; their ids and texts are stable, because tests, ``--json`` readers and people read them. Every check runs: a
failure never hides the next.

The library cross-checks (Transformers' own DeepSpeed mismatch check, DeepSpeed's config parser) run in a child
process started before the first check, so its heavy imports overlap the other checks and never enter this process;
see :mod:`recipekit.validate.static.libraries`.

The bundle loader is :mod:`recipekit.validate.shared.loader`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from recipekit.validate.shared.loader import Bundle
from recipekit.validate.shared.results import Result
from recipekit.validate.static.consistency import (
    check_batch,
    check_device,
    check_port,
    check_precision,
    check_storage,
    check_task_env,
    check_world_size,
)
from recipekit.validate.static.image import stack
from recipekit.validate.static.image.context import check_context
from recipekit.validate.static.image.pins import check_image
from recipekit.validate.static.image.torchbuild import check_torch_build
from recipekit.validate.static.linters import check_hadolint, check_shellcheck
from recipekit.validate.static.megatronlayout import check_megatron_layout
from recipekit.validate.static.monitoring import check_monitoring, check_operations
from recipekit.validate.static.runfiles import check_run_files
from recipekit.validate.static.structure import (
    check_job_schema,
    check_job_webhook,
    check_manifest,
    check_parse,
    check_pod_template,
)
from recipekit.validate.static.tensorparallel import check_tensor_parallel
from recipekit.validate.static.trust import check_trust

#: Every static check, in report order. The library cross-checks are added by :func:`run_static`.
CHECKS: tuple[Callable[[Bundle], Result], ...] = (
    check_parse,
    check_manifest,
    check_job_schema,
    check_job_webhook,
    check_pod_template,
    check_run_files,
    check_trust,
    check_world_size,
    check_task_env,
    check_device,
    check_batch,
    check_tensor_parallel,
    check_megatron_layout,
    check_precision,
    check_image,
    check_context,
    check_storage,
    check_port,
    check_operations,
    check_monitoring,
    check_shellcheck,
    check_hadolint,
    *stack.CHECKS,
    check_torch_build,
)


def run_check(check: Callable[[Bundle], Result], bundle: Bundle) -> Result:
    """Run one check, timed; a check that raises is reported as its own failure and the others still run."""
    name = check.__name__.removeprefix("check_")
    start = time.monotonic()
    try:
        result = check(bundle)
    except Exception as exc:  # noqa: BLE001 - a broken check is reported and the others still run
        result = Result(f"check.{name}", name)
        result.fail("<check>", name, f"the check itself raised {type(exc).__name__}: {exc}")
    result.seconds = time.monotonic() - start
    return result


def run_static(
    bundle: Bundle, *, libraries: bool = True, on_check: Callable[[str], None] | None = None
) -> list[Result]:
    """Run every static check of ``bundle``; the library cross-checks run in a child process meanwhile."""
    from recipekit.validate.static import libraries as library_check

    pending = library_check.start(bundle) if libraries else None
    results: list[Result] = []
    for check in CHECKS:
        if on_check:
            on_check(check.__name__.removeprefix("check_"))
        results.append(run_check(check, bundle))
    if libraries:
        if on_check:
            on_check("transformers / deepspeed cross-checks")
        results.extend(library_check.finish(pending))
    return results
