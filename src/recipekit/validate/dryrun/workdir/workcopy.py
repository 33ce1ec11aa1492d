"""The dry run's work copy: the bundle re-planned for a laptop, with every difference recorded.

Nothing in the bundle is edited by hand. The bundle's resolved recipe (recipe.yaml) is parsed into the typed Recipe,
only what cannot be the same on this machine is substituted *in the recipe*, and the work copy is planned and
rendered by the same code that built the bundle, so every derived number (world size, batch arithmetic, launch data,
Trainer arguments, ds_config) follows from the substitutions exactly as it would on a cluster:

* the model by its tiny twin of the same family (``recipes/model/tiny_<family>.yaml``: random weights, a tokenizer
  trained on the data), the data by a small generated dataset of the recipe's format
  (:mod:`~recipekit.validate.dryrun.workdir.tinydata`), cut into small prepare chunks so that every pod prepares a share
  of it, as every pod of the Job does;
* the shared volume (PVC) by ``<workdir>/shared``: output_dir and data keep their paths below the mount;
* the schedule by a few steps with a checkpoint midway, logging every step, no DataLoader workers, at most
  two accumulation micro-steps;
* the world by ``--pods`` pods × ``--procs-per-pod`` processes, and — on CPU — the hardware by the ``cpu`` option
  (gloo, CPU AdamW, DeepSpeed's CPU accelerator; fp16 becomes bf16, which CPUs have; as many "devices" per node as
  processes per pod), NVMe offload by CPU offload when DeepSpeed's async_io op cannot be built here;
* a TP group may span the simulated pods (TP 2 on 2 pods of one process): on one machine every link is local, so
  the rule that keeps TP inside a node is lifted for the work copy, and said so.

Some edits stay explicit because they are about this machine, not the recipe: the engine's own
(:mod:`~recipekit.validate.dryrun.workdir.engines`: ZeRO-3's ``stage3_param_persistence_threshold`` → 0 for the
Trainer, else a tiny model partitions nothing; the Megatron document's CPU settings), and the rendezvous port (a
free one per attempt, in launch.json). ``substitutions.json`` lists the recipe substitutions with their reasons, then
the difference between the bundle's files and the work copy's, key by key.
"""

from __future__ import annotations

import difflib
import json
import secrets
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from recipekit.base.errors import RecipeError
from recipekit.bundle.files import DS_CONFIG, JOB, LAUNCH, RECIPE, RUN, RUN_FILES, RUN_FILES_CONFIGMAP
from recipekit.recipe.compose import Composed
from recipekit.recipe.sections import Recipe
from recipekit.validate.dryrun.options import DryRunOptions, DryRunUsageError
from recipekit.validate.dryrun.workdir import kept
from recipekit.validate.dryrun.workdir.engines import dryrun_engine
from recipekit.validate.dryrun.workdir.locks import FileLock, claim_workdir
from recipekit.validate.dryrun.workdir.podmount import unmount
from recipekit.validate.dryrun.workdir.substitutions import Substitution, substitute
from recipekit.validate.shared.loader import Bundle, rehash_manifest

if TYPE_CHECKING:
    from recipekit.bundle.build import Compiled
    from recipekit.plan.plan import Plan

MARKER = kept.MARKER
#: Files whose structure is compared key by key between the bundle and its work copy.
_STRUCTURED = (RECIPE, DS_CONFIG, LAUNCH)


@dataclass
class WorkCopy:
    """Where a dry run's copy of the bundle, its shared volume and its logs are."""

    root: Path
    bundle: Path
    shared: Path
    logs: Path
    output_dir: Path
    task_env: str
    run_id: str
    #: the work copy's own plan, as it was compiled (re-planned by a rescale)
    plan: Plan
    substitutions: list[Substitution] = field(default_factory=list)
    deepspeed_extensions: list[str] = field(default_factory=list)
    records_rows: bool = False  # the pods write the row ledger (ops.testing.record_rows, prepared data)
    #: checkpoints go to each pod's node-local hot tier first (train.hot_checkpoints): its own directory per pod
    hot_tier: str = "none"
    #: this run's hold on the work directory (workdir/locks.py), released by :meth:`release` or by dying
    lock: FileLock | None = field(default=None, repr=False, compare=False)

    def release(self) -> None:
        """Let the next dry run use the work directory (the pods, which hold it too, are gone by now)."""
        if self.lock is not None:
            self.lock.close()

    @property
    def run_key(self) -> Path:
        """The simulated cluster's Secret: the run key every pod reads (trust.KEY_ENV), as the Job mounts it."""
        return self.root / "secrets" / "run-key"


def bundle_run_id(bundle: Bundle) -> str:
    """The run id the bundle was built with (recipe.yaml's plan), which its dry run keeps."""
    plan = (bundle.doc or {}).get("plan")
    run_id = plan.get("run_id") if isinstance(plan, dict) else None
    return run_id if isinstance(run_id, str) else ""


# ------------------------------------------------------------------------------------------------ the work copy
def prepare(bundle: Bundle, options: DryRunOptions) -> WorkCopy:
    """Re-plan the bundle's recipe for this machine into ``<workdir>/bundle``; record every difference.

    Without ``--workdir`` every dry run has a work directory of its own (:mod:`.kept`): the newest few of a bundle
    are kept, the older ones removed once this one holds its own."""
    run_id = bundle_run_id(bundle)
    root = (options.workdir or kept.new_workdir(bundle.path, run_id)).resolve()
    if root == bundle.path.resolve() or bundle.path.resolve() in root.parents:
        raise DryRunUsageError(f"--workdir {root}: must be outside the bundle (the bundle is never written to)")
    if root.exists() and any(root.iterdir()) and not (root / MARKER).exists():
        raise DryRunUsageError(
            f"--workdir {root} exists and is not a recipekit dry-run directory: choose an empty or new directory"
        )
    lock = claim_workdir(root, MARKER)  # a second run of the same directory stops here, naming the first
    if options.workdir is None:
        kept.prune(root.parent, kept.KEEP)  # this one included: the newest KEEP stay
    try:
        return _prepare_locked(bundle, options, root, lock, run_id)
    except BaseException:
        lock.close()
        raise


def _prepare_locked(bundle: Bundle, options: DryRunOptions, root: Path, lock: FileLock, run_id: str) -> WorkCopy:
    unmount(root)  # the last run's pods mounted their run files read-only
    for entry in root.iterdir():  # the last run's files; the lock (MARKER) stays, so every run locks one file
        if entry.name != MARKER:
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    assert bundle.recipe is not None
    dry, subs = substitute(bundle.recipe, options, root)
    copy_dir = root / "bundle"
    compiled, explicit = _compile_into(copy_dir, dry, bundle.manifest, run_id)
    plan = compiled.plan
    derived = file_differences(bundle.raw, compiled.files, covered={s.field for s in explicit})
    work = WorkCopy(
        root=root,
        bundle=copy_dir,
        shared=root / "shared",
        logs=root / "logs",
        output_dir=Path(plan.output_dir),
        task_env=plan.task_env,
        run_id=plan.run_id,
        substitutions=subs + explicit + derived,
        plan=plan,
        deepspeed_extensions=deepspeed_extensions(compiled.documents.engine.files.get(DS_CONFIG), options.device),
        records_rows=dry.ops.testing.record_rows and not dry.data.streaming and dryrun_engine(plan.engine).records_rows,
        hot_tier=dry.train.hot_checkpoints.medium,
        lock=lock,
    )
    write_substitutions(work)
    work.run_key.parent.mkdir(mode=0o700)
    work.run_key.write_text(secrets.token_hex(32) + "\n", encoding="ascii")
    work.run_key.chmod(0o400)
    return work


def _compile_into(
    copy_dir: Path, dry: Recipe, manifest: dict[str, Any], run_id: str
) -> tuple[Compiled, list[Substitution]]:
    """Plan and render ``dry`` with the code that built the bundle, with this machine's explicit edits to its
    documents, and write the files into ``copy_dir``; returns the compiled bundle and the explicit edits. The work
    copy is the bundle's run (``run_id``), so its Job, output directory, checkpoints and report carry the bundle's
    run id, not one of the substituted recipe's own."""
    from recipekit.bundle.build import Resolved, compile_bundle
    from recipekit.bundle.render import render
    from recipekit.image.matrix import load_images
    from recipekit.plan.plan import make_plan

    images = load_images()
    try:
        plan = same_run(make_plan(dry, images, tp_across_pods=True), run_id)
    except RecipeError as err:
        raise DryRunUsageError(f"the substituted recipe does not plan: {err}") from None
    composed = Composed(
        raw={}, choices=dict(manifest.get("choices") or {}), overrides=list(manifest.get("overrides") or [])
    )
    compiled = compile_bundle(Resolved(composed, dry, plan, images), allow_oom=True)
    engine, explicit = dryrun_engine(plan.engine).edit(compiled.documents.engine, dry.hw.torch_device)
    if explicit:
        documents = replace(compiled.documents, engine=engine)
        files = render(dry, plan, documents, composed, compiled.estimate, compiled.operations)
        compiled = replace(compiled, documents=documents, files=files)
    for name, data in compiled.files.items():
        path = copy_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (copy_dir / RUN).chmod(0o755)
    return compiled, explicit


def same_run(plan: Plan, run_id: str) -> Plan:
    """``plan`` as run ``run_id``: the run id, and the Job name and output directory made from it."""
    if not run_id or plan.run_id == run_id:
        return plan
    job_name = plan.job_name.removesuffix(plan.run_id) + run_id
    output_dir = plan.output_dir.removesuffix(plan.job_name) + job_name
    return replace(plan, run_id=run_id, job_name=job_name, output_dir=output_dir)


def rescaled_or_refused(recipe: Recipe, pods: int) -> Recipe:
    """``recipe`` on ``pods`` pods at its global batch (plan/rescale.py), or DryRunUsageError with every reason it
    cannot be: asked before any pod starts, and again when the work copy is re-planned."""
    from recipekit.plan.rescale import rescaled

    target, problems = rescaled(recipe, pods)
    if problems:
        raise DryRunUsageError(f"--resume-pods {pods}: " + "; ".join(str(p) for p in problems))
    return target


def rescale_work_copy(work: WorkCopy, pods: int) -> Substitution:
    """The work copy re-planned on ``pods`` pods at its own global batch, by the rule ``recipekit rescale`` rebuilds
    a bundle with (plan/rescale.py): the Job continuing on fewer (or more) nodes after one is lost for good. It must
    be the same run (same run id, so the same output directory and checkpoints)."""
    from recipekit.validate.shared.loader import load_bundle

    copy = load_bundle(work.bundle)
    assert copy.recipe is not None
    before = copy.recipe.cluster.nodes
    target = rescaled_or_refused(copy.recipe, pods)
    compiled, _ = _compile_into(work.bundle, target, copy.manifest, work.run_id)
    plan = work.plan = compiled.plan
    if plan.run_id != work.run_id:
        raise DryRunUsageError(f"--resume-pods {pods}: the rescaled work copy is run {plan.run_id}, not {work.run_id}")
    change = Substitution(
        RECIPE,
        "recipe.cluster.nodes",
        before,
        pods,
        f"a pod lost for good: the Job continues on {pods} pod(s) at the same global batch (recipekit rescale)",
    )
    work.substitutions.append(change)
    write_substitutions(work)
    return change


def write_substitutions(work: WorkCopy) -> None:
    """``substitutions.json``: every difference between the bundle and its work copy, as the dry run made them."""
    (work.root / "substitutions.json").write_text(
        json.dumps([s.to_json() for s in work.substitutions], indent=2, default=str) + "\n", encoding="utf-8"
    )


def deepspeed_extensions(ds: dict[str, Any] | None, device: str) -> list[str]:
    """The DeepSpeed C++ ops the pods will JIT-build on this CPU: prebuilt once, timed apart from the run."""
    if ds is None or device != "cpu":
        return []
    ops = ["ShareMemCommBuilder"]  # DeepSpeed's CPU collectives
    zero = ds.get("zero_optimization") or {}
    devices = {(zero.get(k) or {}).get("device") for k in ("offload_optimizer", "offload_param")}
    if devices & {"cpu", "nvme"} or "optimizer" in ds:
        ops.append("CPUAdamBuilder")
    if "nvme" in devices:
        ops.append("AsyncIOBuilder")
    return ops


def set_master_port(work: WorkCopy, port: int) -> None:
    """A free rendezvous port for one attempt: the launcher reads it from launch.json, one of the run files, so the
    ConfigMap and the Job's digest of them are stamped again (as a rebuild would render them)."""
    from recipekit.bundle.render import restamp_run_files

    path = work.bundle / LAUNCH
    launch = json.loads(path.read_text(encoding="utf-8"))
    launch["master_port"] = port
    path.write_text(json.dumps(launch, indent=2) + "\n", encoding="utf-8")
    files = {
        name: (work.bundle / name).read_bytes()
        for name in (*RUN_FILES, JOB, RUN_FILES_CONFIGMAP)
        if (work.bundle / name).is_file()
    }
    for name, data in restamp_run_files(files).items():
        (work.bundle / name).write_bytes(data)
    rehash_manifest(work.bundle)


# ------------------------------------------------------------------------------------------------- the diff
def file_differences(before: dict[str, bytes], after: dict[str, bytes], covered: set[str]) -> list[Substitution]:
    """How the work copy's pod-side files differ from the bundle's, key by key (the recipe section is described by
    the substitutions themselves, so recipe.yaml's ``recipe`` keys are left out)."""
    found: list[Substitution] = []
    for name in _STRUCTURED:
        old, new = _load(name, before.get(name)), _load(name, after.get(name))
        if name == RECIPE:
            old, new = {k: v for k, v in old.items() if k != "recipe"}, {k: v for k, v in new.items() if k != "recipe"}
        for key, a, b in _leaf_changes(old, new):
            if key not in covered:
                found.append(Substitution(name, key, a, b, "follows from the substitutions (re-planned)", derived=True))
    for name in (RUN,):
        if before.get(name) != after.get(name):
            changed = sum(
                1
                for line in difflib.unified_diff(
                    (before.get(name) or b"").decode().splitlines(), (after.get(name) or b"").decode().splitlines(), n=0
                )
                if line[:1] in "+-" and not line.startswith(("+++", "---"))
            )
            why = f"re-rendered for the substituted hardware ({changed} lines)"
            found.append(Substitution(name, "", None, None, why, derived=True))
    return found


def _load(name: str, data: bytes | None) -> dict[str, Any]:
    if data is None:
        return {}
    loaded = json.loads(data) if name.endswith(".json") else yaml.safe_load(data)
    return loaded if isinstance(loaded, dict) else {}


def _leaf_changes(old: Any, new: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        changes = []
        for key in list(old) + [k for k in new if k not in old]:
            path = f"{prefix}.{key}" if prefix else str(key)
            changes.extend(_leaf_changes(old.get(key), new.get(key), path))
        return changes
    return [] if old == new else [(prefix, old, new)]
