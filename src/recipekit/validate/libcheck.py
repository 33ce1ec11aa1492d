"""The bundle's Trainer arguments and ds_config as the real libraries read them, in a child process.

* Transformers: ``HfArgumentParser(TrainingArguments).parse_dict`` (unknown or ill-typed arguments fail), then the
  Trainer's own DeepSpeed integration, ``HfTrainerDeepSpeedConfig(ds).trainer_config_process(args)``, which lists
  every ds_config value that disagrees with the arguments — what stops a job at start-up with "Please correct the
  following DeepSpeed config values that mismatch TrainingArguments values".
* DeepSpeed: ``DeepSpeedConfig(ds)``, which asserts train_batch_size = micro × accumulation × world size and
  validates every section (ZeRO keys are a closed pydantic model).

Both are run *as in the cluster*: at the bundle's world size (the arguments' ``world_size`` and DeepSpeed's
``dist.get_world_size`` report the plan's value) and with the cluster-only settings set aside (``use_cpu``, no
``ddp_backend``, no ``deepspeed`` path), because TrainingArguments would otherwise try to reach the devices and
process group of this machine. The device-specific values themselves are checked by ``consistency.device``.

The child keeps torch/transformers/deepspeed out of the validating process (12 s of imports, and TrainingArguments
sets up accelerator state). Results are cached by content: same inputs, same library versions and same checking
code give the same answer, so a second ``validate`` of an unchanged bundle takes a second.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipekit.paths import cache_dir
from recipekit.validate.checks import Finding, Result

TIMEOUT_S = 240
_LIBRARIES = ("transformers", "deepspeed", "accelerate", "torch")
_MISMATCH = re.compile(r"^- ds (?P<ds>\S+)=(?P<dv>.*) vs hf (?P<hf>.+?)=(?P<hv>.*)$")


@dataclass
class Pending:
    key: str
    proc: subprocess.Popen[str] | None = None
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


def start(bundle: Any) -> Pending:
    """Start the child (or find a cached answer) for ``bundle`` (a :class:`recipekit.validate.static.Bundle`)."""
    payload = {
        "training_arguments": bundle.args,
        "ds_config": bundle.ds_config,
        "world_size": bundle.plan.get("dp_size") or bundle.plan.get("world_size"),
    }
    versions = _versions()
    code = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    key = hashlib.sha256(json.dumps([payload, versions, code], sort_keys=True, default=str).encode()).hexdigest()[:24]
    pending = Pending(key)
    if not bundle.args or not isinstance(payload["world_size"], int):
        pending.skip = "needs recipe.yaml's training_arguments and plan"
        return pending
    if versions["transformers"] is None and versions["deepspeed"] is None:
        pending.skip = "transformers and deepspeed are not installed here (pip install 'recipekit[train]')"
        return pending
    cached = cache_dir("validate") / f"libcheck-{key}.json"
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
            [sys.executable, "-m", "recipekit.validate.libcheck"],
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=env,
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


# ------------------------------------------------------------------------------------------------------ the child
def _finding(file: str, field: str, message: str, hint: str = "") -> dict[str, str]:
    return Finding(file, field, message, hint).to_json()


def _check_transformers(payload: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    import time

    start = time.monotonic()
    try:
        import transformers
        from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig
    except ImportError as exc:
        return {"status": "skipped", "reason": f"transformers not importable: {exc}"}, None
    world = int(payload["world_size"])
    args = {**payload["training_arguments"], "use_cpu": True, "ddp_backend": None, "deepspeed": None}
    at_world = type(
        "ClusterTrainingArguments", (transformers.TrainingArguments,), {"world_size": property(lambda self: world)}
    )
    findings: list[dict[str, str]] = []
    parsed = None
    try:
        (parsed,) = transformers.HfArgumentParser(at_world).parse_dict(args, allow_extra_keys=False)
    except (ValueError, TypeError) as exc:
        text = " ".join(str(exc).split())
        unknown = re.search(r"not used by the HfArgumentParser: \[(.*)\]", text)
        if unknown:
            for key in re.findall(r"'([^']+)'", unknown.group(1)):
                findings.append(
                    _finding(
                        "recipe.yaml",
                        f"training_arguments.{key}",
                        f"TrainingArguments (transformers {transformers.__version__}) has no such argument",
                    )
                )
        else:
            findings.append(
                _finding("recipe.yaml", "training_arguments", f"TrainingArguments rejects them: {text[:300]}")
            )
    ds_out = None
    if parsed is not None and payload.get("ds_config") is not None:
        hf = HfTrainerDeepSpeedConfig(copy.deepcopy(payload["ds_config"]))
        try:
            hf.trainer_config_process(parsed)
        except ValueError as exc:
            hf.mismatches = hf.mismatches or [line for line in str(exc).splitlines() if line.startswith("- ds ")]
        for line in hf.mismatches:
            match = _MISMATCH.match(line.strip())
            if match:
                findings.append(
                    _finding(
                        "ds_config.json",
                        match["ds"],
                        f"{match['dv']}, but the Trainer computes {match['hf']} = {match['hv']} "
                        f"at world size {world}: it refuses to start",
                    )
                )
            else:
                findings.append(_finding("ds_config.json", "", line.strip()))
        ds_out = hf.config
    reason = f"transformers {transformers.__version__}, world size {world}"
    return {
        "status": "fail" if findings else "pass",
        "findings": findings,
        "reason": reason,
        "seconds": time.monotonic() - start,
    }, ds_out


def _fill_auto(value: Any) -> Any:
    """DeepSpeed rejects "auto" strings the Trainer fills only once it has the model and the step count."""
    if isinstance(value, dict):
        return {k: _fill_auto(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill_auto(v) for v in value]
    return 0.0 if value == "auto" else value


def _check_deepspeed(payload: dict[str, Any], filled: Any) -> dict[str, Any]:
    import time

    start = time.monotonic()
    if payload.get("ds_config") is None:
        return {"status": "skipped", "reason": "DDP bundle: no ds_config.json"}
    try:
        import deepspeed
        from deepspeed.runtime import config as ds_runtime_config
    except ImportError as exc:
        return {"status": "skipped", "reason": f"deepspeed not importable: {exc}"}
    world = int(payload["world_size"])
    config = _fill_auto(filled if filled is not None else payload["ds_config"])
    dist = ds_runtime_config.dist
    saved = dist.get_rank, dist.get_world_size
    dist.get_rank, dist.get_world_size = (lambda *a, **k: 0), (lambda *a, **k: world)
    findings = []
    try:
        ds_runtime_config.DeepSpeedConfig(config)
    except Exception as exc:  # noqa: BLE001 - AssertionError, ValueError, pydantic's ValidationError alike
        text = " ".join(str(exc).split())
        field = ""
        for key in ("train_batch_size", "zero_optimization", "bf16", "fp16", "optimizer", "scheduler"):
            if key in text:
                field = key
                break
        findings.append(
            _finding("ds_config.json", field, f"DeepSpeed {deepspeed.__version__} rejects it: {text[:400]}")
        )
    finally:
        dist.get_rank, dist.get_world_size = saved
    return {
        "status": "fail" if findings else "pass",
        "findings": findings,
        "reason": f"deepspeed {deepspeed.__version__}, world size {world}",
        "seconds": time.monotonic() - start,
    }


def main() -> None:
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    payload = json.loads(sys.stdin.read())
    transformers_verdict, filled = _check_transformers(payload)
    answer = {"transformers": transformers_verdict, "deepspeed": _check_deepspeed(payload, filled)}
    sys.stdout.write("\n" + json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
