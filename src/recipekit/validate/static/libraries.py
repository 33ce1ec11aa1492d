"""The bundle's Trainer arguments and ds_config as the real libraries read them, in a child process.

* Transformers: ``HfArgumentParser(TrainingArguments).parse_dict`` (unknown or ill-typed arguments fail), then the
  Trainer's own DeepSpeed integration, ``HfTrainerDeepSpeedConfig(ds).trainer_config_process(args)``, which lists
  every ds_config value that disagrees with the arguments — what stops a job at start-up with "Please correct the
  following DeepSpeed config values that mismatch TrainingArguments values" — and the global batch the Trainer
  counts (micro × accumulation × world size // the TP degree it reads from the ds_config), against the plan's.
* DeepSpeed: ``DeepSpeedConfig(ds)``, which asserts train_batch_size = micro × accumulation × world size and
  validates every section (ZeRO keys are a closed pydantic model).

Both are run *as in the cluster*: at the bundle's world size (the arguments' ``world_size`` and DeepSpeed's
``dist.get_world_size`` report the plan's value) and with the cluster-only settings set aside (``use_cpu``, no
``ddp_backend``, no ``deepspeed`` path), because TrainingArguments would otherwise try to reach the devices and
process group of this machine. The device-specific values themselves are checked by ``consistency.device``.

This module is the validating process's side: it starts the child (:mod:`recipekit.validate.static.librarychild`, which
keeps torch/transformers/deepspeed and the accelerator state TrainingArguments sets up out of this process), caches its
answer and turns it into results. What a first check costs, and how that is kept down:

* **Only the checks' imports.** The child imports the four modules the checks use, hides peft (which transformers
  imports whenever installed, and which imports transformers' modelling code) and answers TrainingArguments'
  Kubeflow probe without importing the modelling stack; the verdicts stay the libraries' own (see librarychild). What
  is left is mostly ``import torch`` (which TrainingArguments and DeepSpeed both need) and the two libraries'
  package imports.
* **Cached by content, not by bundle.** The answer depends only on the Trainer arguments, ds_config, the world size,
  the library versions and the checking code. The arguments that only *name* the run (:data:`IDENTITY_ARGS`:
  output_dir, run_name — output_dir carries the run id, which changes with the model path or data path) are replaced
  by fixed stand-ins before hashing *and* before checking, so the cached answer is exactly the answer for those
  inputs, and every bundle with equal training arguments — rebuilt, moved, another data path or queue — shares it.
* **Concurrent.** The child starts before the first static check and is collected after the last.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipekit.base.paths import cache_dir
from recipekit.bundle.files import DS_CONFIG
from recipekit.validate.shared.childpython import python_argv, safe_env
from recipekit.validate.shared.ports import free_port
from recipekit.validate.shared.results import Result

TIMEOUT_S = 240
_LIBRARIES = ("transformers", "deepspeed", "accelerate", "torch")
#: Trainer arguments read as opaque names by both checks, with the stand-ins the child checks instead.
IDENTITY_ARGS = {"output_dir": "/output", "run_name": "run", "logging_dir": "/output/logs"}


@dataclass
class Pending:
    key: str
    proc: subprocess.Popen[bytes] | None = None
    cached: dict[str, Any] | None = None
    skip: str = ""
    workdir: Path | None = None


def _read_and_remove(pending: Pending) -> tuple[str, str]:
    if pending.workdir is None:
        return "", ""
    out = (pending.workdir / "out.txt").read_text(encoding="utf-8", errors="replace")
    err = (pending.workdir / "err.txt").read_text(encoding="utf-8", errors="replace")
    shutil.rmtree(pending.workdir, ignore_errors=True)
    return out, err


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    found: dict[str, str | None] = {}
    for name in _LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def payload_of(bundle: Any) -> dict[str, Any]:
    """What the checks read from ``bundle`` (a :class:`recipekit.validate.shared.loader.Bundle`), identity stand-ins
    in."""
    args = dict(bundle.args)
    for key, stand_in in IDENTITY_ARGS.items():
        if isinstance(args.get(key), str):
            args[key] = stand_in
    return {
        "training_arguments": args,
        "ds_config": bundle.ds_config,
        # every process, TP ranks included: what TrainingArguments.world_size and DeepSpeed's dist report
        "world_size": bundle.plan.get("world_size"),
        "global_batch_size": bundle.plan.get("global_batch_size"),
    }


def _unreadable(bundle: Any) -> str | None:
    """The checked file the loader refused (not JSON, nested too deep), if any: checking the bundle without it would
    start a child that imports the training stack to judge a config the bundle does not hold."""
    refused = {finding.file for finding in bundle.parse_findings}
    return DS_CONFIG if DS_CONFIG in refused else None


def cache_key(payload: dict[str, Any], versions: dict[str, str | None]) -> str:
    """The answer's identity: the checked inputs, the library versions, and the checking code (this module and
    :mod:`~recipekit.validate.static.librarychild`)."""
    here = Path(__file__).parent
    code = hashlib.sha256(
        b"".join((here / name).read_bytes() for name in ("libraries.py", "librarychild.py"))
    ).hexdigest()
    return hashlib.sha256(json.dumps([payload, versions, code], sort_keys=True, default=str).encode()).hexdigest()[:24]


def start(bundle: Any) -> Pending:
    """Start the child (or find a cached answer) for ``bundle`` (a :class:`recipekit.validate.shared.loader.Bundle`)."""
    payload = payload_of(bundle)
    versions = _versions()
    pending = Pending(cache_key(payload, versions))
    if not payload["training_arguments"] or not isinstance(payload["world_size"], int):
        pending.skip = "needs recipe.yaml's training_arguments and plan"
        return pending
    if versions["transformers"] is None and versions["deepspeed"] is None:
        pending.skip = "transformers and deepspeed are not installed here (pip install 'recipekit[train]')"
        return pending
    if unreadable := _unreadable(bundle):
        pending.skip = f"{unreadable} could not be read (files.parse says why): nothing for the libraries to check"
        return pending
    cached = cache_dir("validate") / f"libcheck-{pending.key}.json"
    if cached.is_file():
        try:
            pending.cached = json.loads(cached.read_text(encoding="utf-8"))
            return pending
        except ValueError:
            pass
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "TRANSFORMERS_VERBOSITY": "error",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONWARNINGS": "ignore",
        # transformers' own switch: its Kubeflow probe answers False, as the child's stand-in does (see librarychild).
        "DISABLE_KUBEFLOW_INTEGRATION": "TRUE",
        # TrainingArguments with a ds_config forms a one-process group: on a port of its own, never torch's fixed
        # default, which a training run or another check on this machine may hold
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    # Files, not pipes: the child's chatter can exceed a pipe buffer while this process is busy with other checks.
    pending.workdir = Path(tempfile.mkdtemp(prefix="recipekit-libcheck-"))
    (pending.workdir / "in.json").write_text(json.dumps(payload), encoding="utf-8")
    with (
        open(pending.workdir / "in.json", "rb") as stdin,
        open(pending.workdir / "out.txt", "wb") as stdout,
        open(pending.workdir / "err.txt", "wb") as stderr,
    ):
        pending.proc = subprocess.Popen(
            python_argv("-m", "recipekit.validate.static.librarychild"),
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=safe_env(env),
            start_new_session=True,
        )
    return pending


def finish(pending: Pending | None) -> list[Result]:
    """Collect the child's verdicts as two results: library.transformers and library.deepspeed."""
    results = [
        Result(
            "library.transformers", "Transformers: TrainingArguments parse + HfTrainerDeepSpeedConfig mismatch check"
        ),
        Result("library.deepspeed", "DeepSpeed: DeepSpeedConfig at the bundle's world size"),
    ]
    if pending is None:
        return [r.skip("not run") for r in results]
    if pending.skip:
        return [r.skip(pending.skip) for r in results]
    answer = pending.cached
    if answer is None and pending.proc is not None:
        try:
            pending.proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pending.proc.kill()
            pending.proc.wait()
            return [r.skip(f"the library check did not finish in {TIMEOUT_S} s") for r in results]
        finally:
            out, err = _read_and_remove(pending)
        try:
            answer = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            tail = (err or out).strip().splitlines()[-3:]
            for r in results:
                r.fail("<check>", r.id, "the library check crashed: " + " | ".join(tail))
            return results
        if pending.proc.returncode == 0:
            path = cache_dir("validate") / f"libcheck-{pending.key}.json"
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(answer), encoding="utf-8")
                os.replace(tmp, path)
            except OSError:
                pass
    assert answer is not None
    if pending.cached is None:  # what a first validate spends its time on
        results[0].details.update(
            child_imports_s=answer.get("imports_s"), modelling_stack_imported=answer.get("modelling_stack_imported")
        )
    for result in results:
        verdict = answer.get(result.id.split(".", 1)[1], {})
        if verdict.get("status") == "skipped":
            result.skip(verdict.get("reason", ""))
            continue
        for finding in verdict.get("findings", []):
            result.fail(finding["file"], finding["field"], finding["message"], finding.get("hint", ""))
        result.reason = verdict.get("reason", "")
        if pending.cached is not None:
            result.reason = (result.reason + " (cached result)").strip()
        else:
            result.seconds = float(verdict.get("seconds", 0.0))
    return results
