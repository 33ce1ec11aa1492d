"""HF weights in: the HF model directory as a Megatron checkpoint (Bridge's ``AutoBridge.import_ckpt``, no conversion
of ours), once per run, signed like a checkpoint, in ``<output_dir>/megatron-init``: the base every start of the run
loads (``checkpoint.pretrained_checkpoint``) until it has a checkpoint of its own.

Bridge's PEFT loads its frozen base from a Megatron checkpoint and saves adapter states only, so LoRA needs the base
as one; full SFT and pretraining load it the same way (weights only, iteration 0), which also keeps the model built
by Megatron's own initialisation (container.provider says why that matters). The torch_dist format re-shards on
load, so one import serves any TP/PP/EP layout.

Rank 0 runs the import in a child process (``python -m runtime.megatron.hfimport HF_DIR OUT_DIR``: Bridge's import
makes a one-process distributed context of its own, which must not meet the run's); the other ranks wait for the
signed record, before the run's process group forms. Every rank verifies the record and digests before Bridge
opens a byte of it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..boundary import filenames, jsonfile
from ..boundary.common import RunError, log0, rank
from ..boundary.resume import resumechoice
from ..volume import trust
from ..volume.resume import RECORD_EXCLUDED, RECORD_MAX_BYTES

#: Seconds between the other ranks' looks for rank 0's import; how long they wait.
POLL_S = 1.0
WAIT_S = 6 * 3600.0
#: The variables of torchrun's rendezvous, which the child must not inherit (its context is its own; with
#: TORCHELASTIC_USE_AGENT_STORE its store would wait, a client, for the agent's).
RENDEZVOUS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def child_environment(environ: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k not in RENDEZVOUS and not k.startswith(("TORCHELASTIC_", "ROLE_"))}


def imported(
    model_path: str, destination: Path, run_id: str, key: bytes | None, backend: str, model: dict[str, Any]
) -> Path:
    """The signed import of ``model_path`` in ``destination`` (made by rank 0 when missing), verified here."""
    if rank() == 0 and not _signed(destination):
        shutil.rmtree(destination, ignore_errors=True)
        log0("importing %s as a Megatron checkpoint into %s (AutoBridge.import_ckpt)", model_path, destination)
        started = time.monotonic()
        env = child_environment(dict(os.environ))
        argv = [
            sys.executable,
            "-m",
            f"{__package__}.hfimport",
            model_path,
            str(destination),
            backend,
            json.dumps(model),
        ]
        done = subprocess.run(argv, env=env, check=False)
        if done.returncode != 0:
            raise RunError(f"importing {model_path} failed (exit {done.returncode}; its log is above)")
        record = {"run_id": run_id, "source": model_path, "step": 0}
        if key is not None:
            record = trust.sign(record, key, trust.digests(destination, RECORD_EXCLUDED))
        resumechoice.write_run_record(destination, record)
        log0("imported in %.0f s", time.monotonic() - started)
    deadline = time.monotonic() + WAIT_S
    while not _signed(destination):
        if time.monotonic() > deadline:
            raise RunError(f"rank 0 did not import the HF weights into {destination} within {WAIT_S:.0f} s")
        time.sleep(POLL_S)
    verify(destination, model_path, key)
    return destination


def _signed(destination: Path) -> bool:
    return (destination / filenames.RUN_FILE).is_file()


def verify(destination: Path, model_path: str, key: bytes | None) -> None:
    """The import is this run's, of this model, unchanged since it was signed (a RunError otherwise)."""
    if key is None:
        log0("no run key: the imported base in %s is used unverified", destination)
        return
    try:
        record = jsonfile.read(destination / filenames.RUN_FILE, RECORD_MAX_BYTES)
        trust.verify_directory(destination, record, key, RECORD_EXCLUDED, destination.name)
    except (OSError, ValueError, trust.Untrusted) as exc:
        raise RunError(f"refusing the imported base: {exc}; remove {destination} to import again") from None
    if record.get("source") != model_path:
        raise RunError(f"{destination} holds {record.get('source')!r}, not {model_path}: remove it to import again")


#: The document's model fields the import leaves out: its model is one process, the run's layout is not its own.
LAYOUT_FIELDS = frozenset(
    {
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "virtual_pipeline_model_parallel_size",
        "num_layers_in_first_pipeline_stage",
        "num_layers_in_last_pipeline_stage",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
        "context_parallel_size",
        "sequence_parallel",
    }
)


def main(argv: list[str]) -> int:
    """The child: import ``argv[0]`` (an HF directory) into ``argv[1]``, in a one-process group of backend
    ``argv[2]`` (Bridge's ``temporary_distributed_context``: its model build would otherwise start NCCL), the model
    built as the run builds it (``argv[3]``: the document's model section, JSON; its layer spec names the norms in
    the state dict, its fusions are validated). Bridge's own ``AutoBridge.import_ckpt``, step by step."""
    from .redirect import REDIRECT_ENV

    if os.environ.get(REDIRECT_ENV):  # the parent checked the recipe's target before starting this child
        from .redirect import install_if_asked

        install_if_asked(_cpu())
    from megatron.bridge import AutoBridge
    from megatron.bridge.training.model_load_save import temporary_distributed_context

    from .container import apply, layer_spec

    source, destination, backend, model = argv[0], argv[1], argv[2], json.loads(argv[3])
    with temporary_distributed_context(backend=backend):
        bridge = AutoBridge.from_hf_pretrained(source)
        provider = bridge.to_megatron_provider(load_weights=True)
        apply(provider, {k: v for k, v in model.items() if k not in LAYOUT_FIELDS}, "model")
        layer_spec(provider, model)
        provider.finalize()
        built = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
        bridge.save_megatron_model(built, destination, hf_tokenizer_path=source, low_memory_save=True)
    return 0


def _cpu() -> Any:
    """The hardware view of a CPU recipe: the parent started this child for one (the redirect's own condition)."""
    from ..boundary.recipeview import HardwareView

    return HardwareView("cpu", "cpu", "cpu", None, None, {}, 0.0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
