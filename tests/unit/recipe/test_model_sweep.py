"""Every decoder-only text architecture the pinned transformers ships: `recipekit model import` gives transformers'
exact parameter count, or refuses in one line with the reason. Never a wrong count. And for every one that imports,
the plan's FLOPs per token are torch's FLOP counter's over the real module (on the meta device, or on the CPU with
real tensors where a module cannot run on meta), and an MoE model's active count leaves out exactly the routed experts
a token does not use.

The architectures come from transformers' own causal-LM mapping (not a hand list); kept are those that are neither
encoder-decoder, encoder-only (masked LM) nor multimodal (sub-configs), and whose default config
(``AutoConfig.for_model``) builds on the meta device. The rates are printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from recipekit.cli import main
from recipekit.recipe.measured import modelflops, modelmemory
from recipekit.recipe.schema import validate
from recipekit.recipe.sections import ModelSpec, Recipe
from recipekit.runtime.boundary import layerkinds
from recipekit.runtime.model import shrink

torch = pytest.importorskip("torch")


@dataclass(frozen=True)
class Swept:
    """One kept architecture: its default config, transformers' parameter count (tied tensors once) and each decoder
    module's kind over the full depth (what the depth cut keeps: runtime.boundary.layerkinds.shortest_cut)."""

    config: Any
    exact: int
    kinds: list[tuple[str, ...]]


@pytest.fixture(scope="module")
def swept() -> dict[str, Swept]:
    return decoder_only_text_architectures()


def decoder_only_text_architectures() -> dict[str, Swept]:
    """model_type → :class:`Swept` for every kept architecture."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )

    encoders = set(MODEL_FOR_MASKED_LM_MAPPING_NAMES) | set(MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)
    kept: dict[str, Swept] = {}
    for model_type in sorted(set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) - encoders):
        try:
            config = AutoConfig.for_model(model_type)
            if getattr(config, "is_encoder_decoder", False) or getattr(config, "sub_configs", None):
                continue
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config)
        except Exception:  # a default config that does not build on meta is outside the sweep
            continue
        exact = sum({id(p): p.numel() for p in model.parameters()}.values())
        kinds = layerkinds.layer_kinds(model)
        kept[model_type] = Swept(config, exact, kinds)
    return kept


def _import(folder: Path, config: Any) -> tuple[Any, Path]:
    """`recipekit model import` of ``config`` written as a config.json in ``folder``: the CLI's result and option."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config.to_dict(), default=str))
    out = folder / "option.yaml"
    return CliRunner().invoke(main, ["model", "import", str(folder), "-o", str(out), "--name", "swept"]), out


def _not_measured(model: Any) -> Any:
    raise RuntimeError("not measured in the sweep")


def _not_measured_activations(config: Any, kinds: Any = None) -> Any:
    raise RuntimeError("not measured in the sweep")


@pytest.mark.slow
def test_model_import_is_exact_or_refuses_for_every_decoder_only_architecture(
    swept: dict[str, Swept], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This test is about counts and refusals at full depth: the FLOP counter's pass (a state-space model's reference
    # scan loops over the positions of every layer) is left out and the import takes its analytic path; the FLOPs are
    # checked on depth-reduced copies below. So is the memory tracker's (the option then has no model.activations):
    # it is checked on the catalog and on tests/unit/memory/test_activations_measured.py's models.
    monkeypatch.setattr(modelflops, "measure", _not_measured)
    monkeypatch.setattr(modelmemory, "measure", _not_measured_activations)
    architectures = swept
    assert len(architectures) > 100  # the pinned transformers ships well over a hundred
    imported, refused = [], {}
    for model_type, arch in architectures.items():
        result, out = _import(tmp_path / model_type, arch.config)
        if result.exit_code == 0:
            assert yaml.safe_load(out.read_text())["params"]["total"] == arch.exact, model_type  # never a wrong count
            imported.append(model_type)
            continue
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and "Traceback" not in result.output, (model_type, lines)
        refused[model_type] = lines[0]
    rate = len(imported) / len(architectures)
    print(f"\nmodel import: {len(imported)} of {len(architectures)} decoder-only text architectures ({rate:.0%})")
    print("imported:", ", ".join(imported))
    for model_type, line in sorted(refused.items()):
        print(f"refused {model_type}: {line}")
    assert {"llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "glm4"} <= set(imported)
    assert rate >= 0.9, f"only {rate:.0%} import; refused: {sorted(refused)}"


# ------------------------------------------------------------------------------------------------ FLOPs and MoE
#: Where the counter checks the plan: 4 times the import's unit (it measured at 1, 2 and 3 times), so the stored form
#: is checked at the first length it was not solved from, and no chunked kernel pads. One length: a per-token count the
#: stored form does not describe is off there; a second length cost the sweep a minute and found nothing the first did
#: not (test_model_flops checks the catalog's models at two lengths). The shortest such length: a reference scan's
#: operators grow with the positions (benchmarks/bench_model_import.py): 5 times gave a scan 704 positions, not 640.
CHECKED_MULTIPLES = (4,)
#: The plan's FLOPs per token against the counter's (issue 29: within 2%), and the share of imported architectures
#: the counter must check.
TOLERANCE, FLOOR = 0.02, 0.9


@dataclass
class FlopsSweep:
    """What the FLOPs sweep found: each checked architecture's worst ratio, which were checked on the CPU, how each
    was imported where not by the counter on meta, and why any other was not checked."""

    ratios: dict[str, float] = dataclasses.field(default_factory=dict)
    not_checked: dict[str, str] = dataclasses.field(default_factory=dict)
    moe: list[str] = dataclasses.field(default_factory=list)
    counted_by: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # counter_cpu / analytic → types
    on_cpu: list[str] = dataclasses.field(default_factory=list)  # checked by the counter on the CPU

    def summary(self, imported: int) -> str:
        worst = max(self.ratios.items(), key=lambda item: abs(item[1] - 1), default=("none", 1.0))
        cpu, analytic = self.counted_by.get("counter_cpu", []), self.counted_by.get("analytic", [])
        lines = [
            f"\nFLOPs: {len(self.ratios)} of {imported} imported architectures (depth-reduced) checked against the "
            f"counter at {' and '.join(f'{m}×' for m in CHECKED_MULTIPLES)} the import's unit ({len(self.on_cpu)} on "
            f"the CPU: {', '.join(self.on_cpu) or 'none'}); worst ratio {worst[1]:.4f} ({worst[0]}); "
            f"{len(cpu)} imported by the counter on the CPU ({', '.join(cpu) or 'none'}), {len(analytic)} by the "
            f"analytic count ({', '.join(analytic) or 'none'}); {len(self.moe)} MoE with the active count checked"
        ]
        lines += [f"not checked {model_type}: {why}" for model_type, why in sorted(self.not_checked.items())]
        return "\n".join(lines)


@pytest.mark.slow
@pytest.mark.longest
def test_the_plan_s_flops_are_the_counter_s_for_every_imported_architecture(
    swept: dict[str, Swept], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each architecture at the fewest first layers that keep every layer kind (widths and the layer pattern kept:
    the counts per token do not depend on depth beyond the kinds; a module that cannot run on meta at the twin's
    widths, :func:`_checked_config`), imported with the counter (on the CPU where a module cannot run on meta; the
    analytic count where neither can), then the plan's FLOPs per token (recipe_flops,
    what MFU divides by) against an independent FlopCounterMode pass over transformers' module at a length the
    import did not measure: within 2%. That pass runs on the meta device, or on the CPU with real tensors (the same
    depth-cut config built there) where a module cannot run on meta. An MoE model's active count is its total less the
    routed experts a token does not use."""
    from recipekit.bundle.build import resolve
    from recipekit.plan.plan import recipe_flops

    monkeypatch.setattr(modelmemory, "measure", _not_measured_activations)  # FLOPs here; the tracker: see above
    base = resolve(["model=tiny_qwen3", "mode=sft"], analysis_only=True).recipe
    found, imported = FlopsSweep(), 0
    for model_type, arch in swept.items():
        small, counted = _checked_config(arch)
        result, out = _import(tmp_path / model_type, small)
        if result.exit_code:  # a config whose per-layer settings the cut does not follow (full depth: minutes)
            with pytest.MonkeyPatch.context() as patch:  # imported at full depth? counts only, as the sweep above
                patch.setattr(modelflops, "measure", _not_measured)
                if _import(tmp_path / f"{model_type}.full", arch.config)[0].exit_code == 0:
                    imported += 1
                    found.not_checked[model_type] = "its depth-cut config is refused: " + result.output.strip()[:160]
            continue
        imported += 1
        option = validate(ModelSpec, yaml.safe_load(out.read_text()), root="model")
        model = _meta_model(small)
        if _check_active(model, option):
            found.moe.append(model_type)
        assert option.flops is not None
        if option.flops.counted_by != "counter":
            found.counted_by.setdefault(option.flops.counted_by, []).append(model_type)
        lengths = [m * modelflops.sequences(small)[0] for m in CHECKED_MULTIPLES]
        try:
            counted |= _counted(model, small, [n for n in lengths if n not in counted], found.on_cpu, model_type)
        except Exception as exc:  # neither on meta nor on the CPU: said in the summary
            found.not_checked[model_type] = "the counter cannot run it: " + " ".join(str(exc).split())[:160]
            continue
        ratios = [_planned(recipe_flops, base, option, seq_len) / per_token for seq_len, per_token in counted.items()]
        found.ratios[model_type] = max(ratios, key=lambda ratio: abs(ratio - 1))
    print(found.summary(imported))
    off = {model_type: round(ratio, 4) for model_type, ratio in found.ratios.items() if abs(ratio - 1) > TOLERANCE}
    assert not off, f"the plan's FLOPs per token are off the counter's by more than 2%: {off}"
    # not checked: configs whose depth cut (runtime.boundary.layerkinds.cut_depth) drops layers their per-layer
    # settings still name, and any module that runs neither on meta nor on the CPU
    assert len(found.ratios) >= FLOOR * imported, f"only {len(found.ratios)} of {imported} checked"
    assert {"llama", "qwen3_moe", "mixtral", "deepseek_v3", "mamba", "qwen3_next"} <= set(found.ratios)


#: The twin's vocabulary where a model is checked at the twin's widths (the logits' FLOPs scale with it like any width).
TWIN_VOCAB = 1024


def _checked_config(arch: Swept) -> tuple[Any, dict[int, float]]:
    """The config the FLOPs are checked on, and the counter's FLOPs per token of it already counted (length → count):
    the fewest first layers keeping every layer kind, at the architecture's own widths where its module runs on the
    meta device at the longest checked length (that pass is the count there). Where it cannot (a ``Tensor.item()`` on
    data: the counter runs on the CPU with real tensors), at the tiny twin's widths (runtime.model.shrink.twin_config,
    what a dry run trains): the plan's count is a formula of the widths, so any widths check it, and real tensors at
    full width cost the import and the check minutes a model on 2 cores (JetMoE: over a minute). A config the twin
    cannot shrink is checked at its own widths."""
    small = layerkinds.shortest_cut(arch.config, arch.kinds, _builds_on_meta) or arch.config
    longest = max(CHECKED_MULTIPLES) * modelflops.sequences(small)[0]
    try:
        return small, {longest: _counter_per_token(_meta_model(small), longest)}
    except Exception:  # noqa: BLE001 - the counter cannot run it on meta: real tensors, at the twin's widths
        pass
    try:
        return shrink.twin_config(arch.config, TWIN_VOCAB), {}
    except shrink.ShrinkProblem:
        return small, {}


def _builds_on_meta(config: Any) -> bool:
    try:
        _meta_model(config)
    except Exception:  # noqa: BLE001 - a config whose per-layer settings the cut does not follow
        return False
    return True


def _meta_model(config: Any) -> Any:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, experts_implementation="batched_mm")


def _planned(recipe_flops: Any, base: Recipe, option: ModelSpec, seq_len: int) -> float:
    """The plan's training FLOPs per token (full training, what MFU divides by) of ``option`` at ``seq_len``."""
    recipe = dataclasses.replace(base, model=option, data=dataclasses.replace(base.data, max_len=seq_len))
    return float(recipe_flops(recipe, "bf16").model_per_token)


def _counted(model: Any, config: Any, lengths: list[int], on_cpu: list[str], model_type: str) -> dict[int, float]:
    """The counter's FLOPs per token of the meta ``model`` at each length; where a module cannot run on meta, of
    ``config`` built on the CPU with real tensors (``model_type`` then joins ``on_cpu``)."""
    try:
        return {seq_len: _counter_per_token(model, seq_len) for seq_len in lengths}
    except Exception:  # a Tensor.item() on data, a tensor made on the CPU: real tensors, on the CPU
        pass
    params = sum({id(p): p.numel() for p in model.parameters()}.values())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)  # other weights than the import's (seed 0): the counts must not depend on them
        real = _cpu_model(config, params)
        counted = {seq_len: _counter_per_token(real, seq_len) for seq_len in lengths}
    on_cpu.append(model_type)
    return counted


def _cpu_model(config: Any, params: int) -> Any:
    """The causal LM of ``config`` (``params`` parameters) on the CPU with real, random tensors: float32, or bfloat16
    where float32 weights and gradients would pass the import's budget (modelflops.CPU_BUDGET_BYTES; FLOP counts do
    not depend on the dtype)."""
    from transformers import AutoModelForCausalLM

    if 4 * params > modelflops.CPU_BUDGET_BYTES:
        raise RuntimeError(f"cannot run on meta, and {4 * params / 2**30:.1f} GiB of bfloat16 weights and gradients "
                           "is too large for the CPU")  # fmt: skip
    dtype = torch.float32 if 8 * params <= modelflops.CPU_BUDGET_BYTES else torch.bfloat16
    with torch.device("cpu"):
        return AutoModelForCausalLM.from_config(config, experts_implementation="batched_mm", dtype=dtype)


def _counter_per_token(model: Any, seq_len: int) -> float:
    """FlopCounterMode over one forward and backward pass of ``model`` at ``seq_len`` tokens, per token (a model
    that cannot make its decoding cache runs without one). modelflops.counting gives what the device needs: on meta
    transformers' packed-sequence check answered for the one unpacked sequence fed, on the CPU attention through the
    math backend (the counter counts nothing for the CPU's flash kernel); test_model_flops checks both agree."""
    from torch.utils.flop_counter import FlopCounterMode

    ids = torch.zeros((1, seq_len), dtype=torch.long, device=model.device)
    for cache in ({}, {"use_cache": False}):
        try:
            with modelflops.counting(model), FlopCounterMode(display=False) as counter:
                model(input_ids=ids, labels=ids, **cache).loss.backward()
        except Exception:
            if cache:
                raise
            continue
        finally:
            model.zero_grad(set_to_none=True)
        return counter.get_total_flops() / seq_len
    raise AssertionError("unreachable")


def _check_active(model: Any, option: ModelSpec) -> bool:
    """An MoE option's active count is its total less, in each routed-experts module, its parameters × (experts −
    top-k) / experts, as the module tree holds them. Whether the model is MoE."""
    routed = _routed_experts(model)
    assert option.params is not None
    if not routed:
        assert option.num_experts == 0 and option.params.active == option.params.total
        return False
    top_k = option.experts_per_token
    assert option.num_experts == routed[0][1] and 0 < top_k <= option.num_experts, (option.family, routed[0])
    idle = sum(params * (count - top_k) // count for params, count in routed)
    assert option.params.active == option.params.total - idle, option.family
    return True


def _routed_experts(model: Any) -> list[tuple[int, int]]:
    """(parameters, expert count) of each routed-experts module: named ``experts`` or of a class named so (shared
    experts are named otherwise), outermost only, holding one slice per expert (a list of expert modules, or tensors
    whose first dimension is the expert count)."""
    groups: list[tuple[str, int, int]] = []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf != "experts" and not type(module).__name__.endswith("Experts") or "shared" in leaf:
            continue  # shared experts (``shared_experts``, ``shared_expert``) are always active: not routed
        if any(name.startswith(outer + ".") for outer, _, _ in groups):
            continue
        tensors = [p for p in module.parameters(recurse=False) if p.dim() == 3]
        count = len(module) if isinstance(module, torch.nn.ModuleList) else tensors[0].shape[0] if tensors else 0
        if count > 1:
            groups.append((name, sum(p.numel() for p in module.parameters()), int(count)))
    return [(params, count) for _, params, count in groups]
