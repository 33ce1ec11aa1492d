"""``recipekit validate``: static checks of a built bundle, and a dry run of its own scripts as simulated pods.

Public API:

* :func:`validate` — run the checks on a bundle directory and return a
:class:`~recipekit.validate.shared.results.Verdict`.
* :func:`recipekit.validate.shared.loader.load_bundle` and
  :func:`recipekit.validate.static.checks.run_static` — the static part; :data:`recipekit.validate.static.checks.CHECKS`
  lists the checks in report order.
* :func:`recipekit.validate.dryrun.run.run_dry_run` with
  :class:`~recipekit.validate.dryrun.options.DryRunOptions` — the dry run.
* :data:`recipekit.cli.validate.validate_command` — the click command (registered as ``recipekit validate``).

Nothing here imports torch, transformers or deepspeed: the library cross-checks and the dry run run them in child
processes. Earlier modules (recipe, plan, render, bundle, images) never import this package.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from recipekit.validate.shared.results import Finding, Result, Status, Verdict

if TYPE_CHECKING:
    from recipekit.validate.dryrun.options import DryRunOptions

__all__ = ["Finding", "Result", "Status", "Verdict", "validate"]


def validate(
    bundle_dir: Path,
    *,
    dry_run: DryRunOptions | None = None,
    libraries: bool = True,
    progress: Callable[[str], None] = lambda message: None,
) -> Verdict:
    """Validate ``bundle_dir``: every static check, then (with ``dry_run`` options) the dry run.

    Raises :class:`recipekit.validate.shared.loader.BundleUnusable` when the path is not a bundle, and
    :class:`recipekit.validate.dryrun.options.DryRunUsageError` for dry-run options that cannot work.
    """
    from recipekit.validate.shared.loader import load_bundle
    from recipekit.validate.static.checks import run_static

    if dry_run is not None:
        dry_run = dry_run.resolved()  # bad flags are reported before any work; the kill step is settled here, once
        if dry_run.device != "cpu":  # a device this machine lacks: refused, not a dry run skipped under "bundle OK"
            from recipekit.validate.dryrun.options import DryRunUsageError
            from recipekit.validate.dryrun.run import device_problem

            problem = device_problem(dry_run)
            if problem is not None:
                raise DryRunUsageError(problem)
    bundle = load_bundle(Path(bundle_dir))
    from recipekit.validate.static.memoryfit import fit_warnings

    verdict = Verdict(str(bundle.path), warnings=fit_warnings(bundle))
    verdict.extend(run_static(bundle, libraries=libraries, on_check=lambda name: progress(f"static check: {name}")))
    if dry_run is not None:
        from recipekit.validate.dryrun.run import run_dry_run

        verdict.extend(run_dry_run(bundle, dry_run, progress))
    return verdict
