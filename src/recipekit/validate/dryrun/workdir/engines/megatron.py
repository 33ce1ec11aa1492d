"""The Megatron engine's dry run (``engine=megatron``): the bundle's own Job command starts Megatron-Bridge's own
``pretrain()`` through the room (``runtime.megatron.train``) in the engine's own venv, on the CPU.

Everything this machine needs is said here, once, as substitutions and explicit edits the dry run records; the
runtime is never edited:

* **the layout, scaled** (:meth:`MegatronDryRun.layout`): each of TP, PP, EP and virtual pipeline stages is kept
  when it is 1 or 2 and scaled to 2 above (TP 8 × PP 16 × DP 8 → TP 2 × PP 2 × DP over the simulated processes;
  virtual stages run Megatron's interleaved schedule, the twin deepened to whole layers per model chunk); context
  and sequence parallelism go (Transformer Engine's attention and norms are not there: said in
  :data:`NOT_PROVEN`); TP together with EP becomes EP alone (Megatron-core needs SP for it). The simulated world
  (``--pods`` × ``--procs-per-pod``) must hold the scaled model-parallel group, or the dry run says which flags do;
* **the CPU** (the recipe's ``hw=cpu``, which every dry run substitutes): fp32 (the redirect was measured without
  mixed precision), and, as explicit edits of recipe.yaml's ``megatron`` document (:meth:`MegatronDryRun.edit`):
  Megatron's local layers instead of Transformer Engine's, local attention, every fusion off, MoE's grouped GEMM and
  permute fusion off, gloo instead of NCCL;
* **the pods** (:meth:`MegatronDryRun.pod_environment`): the engine's venv first on ``PATH`` (the image's
  ``python3`` and ``torchrun``: :mod:`~recipekit.validate.dryrun.workdir.enginevenv`, built once per machine from
  the image's pins), the CPU redirect named (:mod:`~recipekit.validate.dryrun.workdir.megatroncpu`; the room loads
  it only for a CPU recipe), one OpenMP thread per process;
* **the judges** read the room's records: its signed ``checkpoints/iter_N`` directories (a restart resumes the
  newest signed one, the room's rule), Bridge's own tracker of the last saved iteration, the HF export in ``hf/``,
  each attempt's preflight report and every pod's metrics endpoint (:attr:`MegatronDryRun.operations`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipekit.bundle.files import RECIPE
from recipekit.runtime.boundary import filenames

if TYPE_CHECKING:
    from recipekit.bundle.engines.documents import EngineDocuments
    from recipekit.recipe.sections import Recipe
    from recipekit.validate.dryrun.options import DryRunOptions
    from recipekit.validate.dryrun.workdir.changes import Substituter, Substitution
    from recipekit.validate.shared.loader import Bundle
    from recipekit.validate.shared.results import Result

#: Below the room's output directory: Bridge's checkpoints (runtime/megatron/checkpoints.py, CHECKPOINTS_DIR).
CHECKPOINTS_DIR = "checkpoints"
#: Bridge's checkpoint directories and its tracker of the last one saved (Megatron-Bridge 0.3.1,
#: ``training/utils/checkpoint_utils.py``: get_checkpoint_name, get_checkpoint_tracker_filename).
_ITER = re.compile(r"^iter_(\d{7,18})$")
TRACKER_FILE = "latest_checkpointed_iteration.txt"
#: Below the output directory: the HF export (runtime/megatron/callbacks.py, HF_DIR).
HF_DIR = "hf"
#: The largest size a dry run keeps of each model-parallel dimension: 2 shows the split, 4 processes hold TP × PP.
DRY_MAX_SIZE = 2
#: The model document's settings that name Transformer Engine's or fused kernels, and what the CPU runs instead.
CPU_MODEL = {
    "transformer_impl": "local",
    "attention_backend": "local",
    "bias_activation_fusion": False,
    "masked_softmax_fusion": False,
    "bias_dropout_fusion": False,
    "apply_rope_fusion": False,
    "gradient_accumulation_fusion": False,
    "persist_layer_norm": False,
    "cross_entropy_loss_fusion": False,
}
#: And for an MoE model: its grouped GEMM and permutation kernels are Transformer Engine's.
CPU_MOE = {"moe_grouped_gemm": False, "moe_permute_fusion": False}
#: Why an MoE model is not exported on the CPU (measured: tests/integration/test_megatron_engine.py).
MOE_EXPORT = (
    "Megatron-Bridge 0.3.1 exports experts only under Transformer Engine's grouped-GEMM names; the CPU's local "
    "experts (SequentialMLP) have none"
)
#: Why the dry run trains LoRA without dropout (measured on this CPU, Megatron-Bridge 0.3.1 with the redirect).
ADAPTER_DROPOUT = (
    "a resumed CPU run does not draw the adapters' dropout masks as the first attempt did (replayed steps within "
    "3e-4, not equal): the exact resume is checked without dropout"
)
#: What a CPU dry run of a Megatron bundle does not prove, whatever the recipe (validate's report lists it).
NOT_PROVEN = (
    "kernels: Transformer Engine's (NVIDIA) and MindSpeed's (Ascend) fused attention, norms, rotary, SwiGLU and "
    "grouped GEMM (the dry run trains Megatron's local layers with every fusion off, torch.compile's included)",
    "collectives: NCCL and HCCL, and their topology (gloo on one host here)",
    "numerics: bf16/fp16 mixed precision and FP8 (the dry run trains in fp32)",
    "communication overlap with compute, memory per device and speed",
    "the HF export of MoE experts (Megatron-Bridge 0.3.1 maps them by Transformer Engine's grouped-GEMM names)",
    "dropout's random state across a resume (the dry run trains LoRA without dropout)",
)


class MegatronDryRun:
    """``engine=megatron``: runtime/megatron/train.py under Megatron-Bridge, in the engine's own venv."""

    kind = "megatron"
    entry_file = "runtime/megatron/train.py"
    #: The room writes the steps, start, done and checkpoint records and, through the engine-neutral operations core
    #: (runtime/ops/engineops.py, driven from Bridge's callbacks), the recovery record the resume is judged by, each
    #: attempt's preflight report (before its first step: no Bridge event comes before the model is built) and every
    #: pod's metrics endpoint. The profiler window, injected faults and restarts are not judged for this room yet
    #: (each one added here once a dry run proves it).
    operations: frozenset[str] = frozenset({"recovery", "preflight", "metrics"})
    records_rows = False

    def unrunnable(self, bundle: Bundle, progress: Callable[[str], None]) -> str | None:
        from recipekit.validate.dryrun.workdir.enginevenv import EngineVenvError, engine_python

        try:
            engine_python(progress)
        except EngineVenvError as exc:
            return str(exc)
        return None

    def layout(self, sub: Substituter, dry: Recipe, options: DryRunOptions) -> Recipe:
        """The recipe's layout scaled to the simulated pods (see the module docstring)."""
        from recipekit.validate.dryrun.options import DryRunUsageError

        par = dry.parallel
        tp, pp, ep = (min(size, DRY_MAX_SIZE) for size in (par.tensor_parallel, par.pipeline_parallel,
                                                              par.expert_parallel))  # fmt: skip
        if tp > 1 and ep > 1:
            tp = 1
        vpp = min(par.virtual_pipeline_stages, DRY_MAX_SIZE) if pp > 1 else 1
        scaled = {"tensor_parallel": tp, "pipeline_parallel": pp, "expert_parallel": ep, "virtual_pipeline_stages": vpp}
        dry = sub.section(dry, "parallel", "the layout scaled to a few gloo processes, each split kept", **scaled)
        if par.tensor_parallel > 1 and par.expert_parallel > 1:
            sub.found[-1:] = [replace(s, why=s.why + "; TP with EP needs sequence parallelism") for s in sub.found[-1:]]
        if par.first_stage_layers or par.last_stage_layers:
            dry = sub.section(
                dry,
                "parallel",
                "the twin's layers split evenly over its stages (the document's edge-stage lengths are checked "
                "against Megatron-core's own split, tests/unit/plan/test_megatron_stages.py)",
                first_stage_layers=0,
                last_stage_layers=0,
            )
        dry = sub.section(
            dry,
            "parallel",
            "context and sequence parallelism need Transformer Engine's attention and norms (torch's norms refuse "
            "sequence parallelism)",
            context_parallel=1,
            sequence_parallel=False,
            expert_tensor_parallel=0,
        )
        dry = sub.section(dry, "train", "the CPU redirect was measured in fp32", precision="fp32")
        dry = _without_adapter_dropout(sub, dry)
        need = tp * pp * ep  # TP × PP ranks per data-parallel rank; EP (TP 1 here) over the data-parallel ranks
        world = options.pods * options.procs_per_pod
        if world % need:
            raise DryRunUsageError(
                f"the dry run's Megatron layout TP {tp} × PP {pp} × EP {ep} needs a multiple of {need} processes, "
                f"got --pods {options.pods} × --procs-per-pod {options.procs_per_pod} = {world} (e.g. --pods 2 "
                f"--procs-per-pod {max(1, need // 2)})"
            )
        return dry

    def edit(self, engine: EngineDocuments, device: str) -> tuple[EngineDocuments, list[Substitution]]:
        """recipe.yaml's ``megatron`` document for the CPU: local layers, no fusion, gloo."""
        from recipekit.validate.dryrun.workdir.changes import Substitution

        doc = engine.recipe_sections.get("megatron")
        if device != "cpu" or not isinstance(doc, dict):
            return engine, []
        model = dict(doc.get("model") or {})
        wanted = dict(CPU_MODEL)
        if "moe_token_dispatcher_type" in model:
            wanted |= CPU_MOE
        edits: list[Substitution] = []
        why = "Transformer Engine's and fused kernels are not on a CPU: Megatron's local layers"
        for key, value in wanted.items():
            if model.get(key) != value:
                edits.append(Substitution(RECIPE, f"megatron.model.{key}", model.get(key), value, why))
                model[key] = value
        dist = dict(doc.get("dist") or {})
        if dist.get("distributed_backend") != "gloo":
            edits.append(
                Substitution(
                    RECIPE, "megatron.dist.distributed_backend", dist.get("distributed_backend"), "gloo", "the CPU's"
                )
            )
            dist["distributed_backend"] = "gloo"
        room = dict(doc.get("recipekit") or {})
        if "moe_token_dispatcher_type" in model and room.get("export_hf", True):
            edits.append(Substitution(RECIPE, "megatron.recipekit.export_hf", True, False, MOE_EXPORT))
            room["export_hf"] = False
        edited = {**doc, "recipekit": room, "model": model, "dist": dist}
        return replace(engine, recipe_sections={**engine.recipe_sections, "megatron": edited}), edits

    def pod_environment(self, options: DryRunOptions, env: dict[str, str]) -> dict[str, str]:
        """The engine's venv first on PATH (the pod's ``python3`` and ``torchrun``), the CPU redirect named."""
        from recipekit.validate.dryrun.workdir import megatroncpu
        from recipekit.validate.dryrun.workdir.enginevenv import engine_python

        found = {"PATH": str(engine_python().parent) + os.pathsep + env.get("PATH", ""), "OMP_NUM_THREADS": "1"}
        if options.device == "cpu":
            found[megatroncpu.REDIRECT_ENV] = str(Path(megatroncpu.__file__).resolve())
        return found

    def checkpoints(self, output_dir: Path) -> list[int]:
        """Steps of the signed ``iter_N`` directories: what the room's ``--resume auto`` proves and takes (one
        without its record, a save cut before rank 0 signed it, is passed over)."""
        root = output_dir / CHECKPOINTS_DIR
        try:
            names = os.listdir(root)
        except OSError:
            return []
        found = []
        for name in names:
            match = _ITER.match(name)
            path = root / name
            if match and name.isascii() and not path.is_symlink() and (path / filenames.RUN_FILE).is_file():
                found.append(int(match[1]))
        return sorted(found)

    def resume_step(self, output_dir: Path) -> int | None:
        steps = self.checkpoints(output_dir)
        return steps[-1] if steps else None

    def final_step(self, output_dir: Path) -> int | None:
        """The iteration Bridge's tracker says it saved last (its own state, as the Trainer's trainer_state.json)."""
        try:
            text = (output_dir / CHECKPOINTS_DIR / TRACKER_FILE).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return int(text) if text.isdigit() and len(text) <= 18 else None

    def exports_weights(self, doc: dict[str, Any] | None) -> bool:
        """``megatron.recipekit.export_hf`` (the HF export at the end)."""
        room = ((doc or {}).get("megatron") or {}).get("recipekit") or {}
        return bool(room.get("export_hf", True))

    def final_weights(self, output_dir: Path) -> list[str]:
        return [name for name in filenames.WEIGHT_FILES if (output_dir / HF_DIR / name).is_file()]

    def own_checks(self, bundle: Bundle) -> list[Result]:
        """Megatron-core's argument validation of the layout as built (megatronconfig.py), in the engine's venv."""
        from recipekit.validate.dryrun.workdir.engines.megatronconfig import check_config
        from recipekit.validate.dryrun.workdir.enginevenv import engine_python

        return [check_config(bundle.doc or {}, engine_python())]

    def not_proven(self, bundle: Bundle) -> list[str]:
        """:data:`NOT_PROVEN`, the recipe's own splits the dry run scaled away, and the image's engine version."""
        found = list(NOT_PROVEN)
        recipe = bundle.recipe
        if recipe is not None:
            par = recipe.parallel
            gone = [f"context parallelism {par.context_parallel}"] * (par.context_parallel > 1)
            gone += ["sequence parallelism"] * par.sequence_parallel
            if par.tensor_parallel > 1 and par.expert_parallel > 1:
                gone.append("TP together with EP")
            if gone:
                found.append(f"the recipe's {', '.join(gone)} (the dry run's layout leaves them out)")
        version = image_engine_version(bundle)
        return found + [version] if version else found


def _without_adapter_dropout(sub: Substituter, dry: Recipe) -> Recipe:
    """LoRA without dropout: a resumed CPU run does not draw the adapters' dropout masks again as the first attempt
    did (measured with 0.05: replayed steps within 3e-4, not equal), so the exact resume is checked without it."""
    from recipekit.recipe.sections import adapter_of
    from recipekit.validate.dryrun.workdir.changes import Substitution

    lora = adapter_of(dry.mode)
    if lora is None or lora.dropout == 0:
        return dry
    sub.found.append(Substitution(RECIPE, "recipe.mode.lora.dropout", lora.dropout, 0.0, ADAPTER_DROPOUT))
    mode: Any = dry.mode  # a mode with an adapter (adapter_of): LoRA or QLoRA
    return replace(dry, mode=replace(mode, lora=replace(lora, dropout=0.0)))


def image_engine_version(bundle: Bundle) -> str | None:
    """How the image's Megatron-Bridge differs from the one the dry run ran (the engine venv's pins); None when the
    image pins the same."""
    from recipekit.validate.dryrun.workdir.enginevenv import PINS_FILE, pinned

    ran = dict(line.split("==", 1) for line in pinned(PINS_FILE))
    dockerfile = bundle.dockerfile or ""
    names = ("megatron-bridge", "megatron-core")
    found = {name: m[1] for name in names if (m := re.search(rf"\b{name}==([\w.+-]+)", dockerfile))}
    ours = ", ".join(f"{name} {ran.get(name, '?')}" for name in names)
    if not found:
        return f"the engine the image runs: its Dockerfile pins no Megatron-Bridge; the dry run ran {ours}"
    differ = [f"{name} {found[name]} (dry run: {ran.get(name, '?')})" for name in found if found[name] != ran.get(name)]
    if differ:
        return "the image's engine version: " + ", ".join(differ)
    return None
