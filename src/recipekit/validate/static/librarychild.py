"""The child process of the library cross-checks: the bundle's Trainer arguments and ds_config, read by
Transformers' and DeepSpeed's own code (what they check and why: :mod:`recipekit.validate.static.libraries`).

Run as ``python -m recipekit.validate.static.librarychild`` with the payload on stdin; prints one JSON line of verdicts.

Most of its time is imports, so it imports what the checks need and no more, in two ways that leave every verdict
as the libraries would give it:

* **Packages the checks never use are absent** (:data:`UNUSED_PACKAGES`, ``sys.modules[name] = None``: importing
  them raises ImportError and ``importlib.util.find_spec`` returns None, which is how transformers sees an
  environment without them). transformers imports peft whenever it is installed, and peft imports much of
  transformers' modelling code; neither check builds a model.
* **One question answered without its import** (:data:`DEFERRED`). ``TrainingArguments.__post_init__`` asks
  ``transformers.integrations.integration_utils.is_kubeflow_available()`` whether it runs inside a Kubeflow TrainJob
  (to add a reporter); importing that module imports ``PreTrainedModel`` and the whole modelling stack, as long as
  torch itself. The child's environment sets transformers' own switch ``DISABLE_KUBEFLOW_INTEGRATION=TRUE``, so the
  real function answers False, and a stand-in module gives that same answer without the import. Anything else asked
  of the stand-in imports the real module and answers from it: a transformers that asks for more gets slower, never
  a different verdict.

Together they take the child's imports from about 3× the CPU time of ``import torch`` to under 2×
(``benchmarks/bench_validate.py``).
"""

from __future__ import annotations

import copy
import importlib
import json
import re
import sys
import time
import types
from typing import Any

from recipekit.runtime.boundary import recipeview
from recipekit.validate.shared.results import Finding

_MISMATCH = re.compile(r"^- ds (?P<ds>\S+)=(?P<dv>.*) vs hf (?P<hf>.+?)=(?P<hv>.*)$")
#: Installed packages the libraries import opportunistically but the checks never use.
UNUSED_PACKAGES = ("peft",)
#: Modules whose import costs far more than the answers the checks need from them: module → {name: answer}.
DEFERRED: dict[str, dict[str, Any]] = {
    "transformers.integrations.integration_utils": {"is_kubeflow_available": lambda: False},
}


class DeferredModule(types.ModuleType):
    """A stand-in in ``sys.modules`` that holds a few known answers; asked for anything else, it imports the real
    module in its place and answers from that."""

    def __init__(self, name: str, answers: dict[str, Any]):
        super().__init__(name)
        self.__dict__.update(answers)

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):  # introspection of sys.modules (torch does some), not a use of the module
            raise AttributeError(attribute)
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attribute)


def _finding(file: str, field: str, message: str, hint: str = "") -> dict[str, str]:
    return Finding(file, field, message, hint).to_json()


def _check_transformers(payload: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    start = time.monotonic()
    try:
        import transformers
        from transformers.hf_argparser import HfArgumentParser
        from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig
        from transformers.training_args import TrainingArguments
    except ImportError as exc:
        return {"status": "skipped", "reason": f"transformers not importable: {exc}"}, None
    world = int(payload["world_size"])
    args = {**payload["training_arguments"], "use_cpu": True, "ddp_backend": None, "deepspeed": None}
    at_world = type("ClusterTrainingArguments", (TrainingArguments,), {"world_size": property(lambda self: world)})
    findings: list[dict[str, str]] = []
    parsed = None
    try:
        (parsed,) = HfArgumentParser(at_world).parse_dict(args, allow_extra_keys=False)  # type: ignore[arg-type]
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
    tp = _trainer_tp_size(ds_out)
    if parsed is not None:
        findings += _global_batch_findings(parsed, world, tp, payload.get("global_batch_size"))
    reason = f"transformers {transformers.__version__}, world size {world}" + (
        f" = TP {tp} × DP {recipeview.data_parallel_size(world, tp)}" if tp > 1 else ""
    )
    return {
        "status": "fail" if findings else "pass",
        "findings": findings,
        "reason": reason,
        "seconds": time.monotonic() - start,
    }, ds_out


def _trainer_tp_size(ds_config: Any) -> int:
    """The TP degree the Trainer reads (``Trainer.get_tp_size``: the ds_config's ``tensor_parallel.autotp_size``)."""
    section = ds_config.get("tensor_parallel") if isinstance(ds_config, dict) else None
    value = section.get("autotp_size", 1) if isinstance(section, dict) else 1
    return value if isinstance(value, int) and value > 1 else 1


def _global_batch_findings(args: Any, world: int, tp: int, planned: Any) -> list[dict[str, str]]:
    """The Trainer's global batch (``Trainer.get_total_train_batch_size``: micro × accumulation × world // TP;
    importing the Trainer would import the whole modelling stack, so its formula is applied to the parsed
    arguments) against the plan's."""
    if world % tp:
        return [
            _finding(
                "ds_config.json",
                "tensor_parallel.autotp_size",
                f"{tp} does not divide the world size {world}: DeepSpeed cannot form TP groups",
            )
        ]
    dp = recipeview.data_parallel_size(world, tp)
    counted = args.per_device_train_batch_size * args.gradient_accumulation_steps * dp
    if isinstance(planned, int) and counted != planned:
        return [
            _finding(
                "recipe.yaml",
                "plan.global_batch_size",
                f"{planned}, but the Trainer counts micro {args.per_device_train_batch_size} × accumulation "
                f"{args.gradient_accumulation_steps} × data-parallel {dp} (world {world} // TP {tp}) = {counted}",
            )
        ]
    return []


def _fill_auto(value: Any) -> Any:
    """DeepSpeed rejects "auto" strings the Trainer fills only once it has the model and the step count."""
    if isinstance(value, dict):
        return {k: _fill_auto(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill_auto(v) for v in value]
    return 0.0 if value == "auto" else value


def _check_deepspeed(payload: dict[str, Any], filled: Any) -> dict[str, Any]:
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
    autotp = ""
    try:
        parsed = ds_runtime_config.DeepSpeedConfig(config)
        size = getattr(getattr(parsed, "tensor_parallel_config", None), "autotp_size", 0)
        if size and size > 1:
            autotp = f", AutoTP {size} (it derives train_batch_size {parsed.train_batch_size}, counting every TP rank)"
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
        "reason": f"deepspeed {deepspeed.__version__}, world size {world}{autotp}",
        "seconds": time.monotonic() - start,
    }


def import_libraries() -> float:
    """Import what the checks use, and only that (see the module's docstring); the seconds it took. A library that
    is missing is left for its check to report."""
    start = time.monotonic()
    for name in UNUSED_PACKAGES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    for module in (
        "transformers.training_args",
        "transformers.hf_argparser",
        "transformers.integrations.deepspeed",
        "deepspeed.runtime.config",
    ):
        try:
            importlib.import_module(module)
        except ImportError:
            continue
    # After the imports: a stand-in is for the checks' calls, and a module these imports loaded stays the real one.
    for name, answers in DEFERRED.items():
        sys.modules.setdefault(name, DeferredModule(name, answers))
    return time.monotonic() - start


def main() -> None:
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    payload = json.loads(sys.stdin.read())
    imports_s = import_libraries()
    transformers_verdict, filled = _check_transformers(payload)
    answer = {
        "transformers": transformers_verdict,
        "deepspeed": _check_deepspeed(payload, filled),
        "imports_s": round(imports_s, 2),
        "modelling_stack_imported": "transformers.modeling_utils" in sys.modules,
    }
    sys.stdout.write("\n" + json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
