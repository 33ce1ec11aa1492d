"""Activation memory per token, measured with torch's memory tracker over the real transformers decoder.

The memory estimate's formula counts a Llama block's tensors by hand; a model of another shape (MLA, shared experts,
sliding windows, norms placed elsewhere) keeps something else. Here the architecture's own layers say what they
keep: ``torch.distributed._tools.mem_tracker.MemTracker`` follows every tensor one forward and backward pass of the
decoder creates, under ``FakeTensorMode`` (shapes and sizes, no memory, no arithmetic), and records what autograd
holds at the end of forward (``kept``) and the most activation memory alive at once (``peak``), with gradient
checkpointing off and on.

The model is built from its config under ``FakeTensorMode`` on the CPU device rather than on the meta device: the
CPU's scaled dot-product attention dispatches to its flash kernel, which keeps a logsumexp per head as a device's
fused attention does (the meta device's math path would keep the S×S scores no device keeps). The weights are bf16
and all train (DeepSpeed's 16-bit model); MoE experts run as grouped GEMMs (transformers' default ``grouped_mm``, what
a device runs; ``batched_mm`` would gather each token's expert weights). Packed-sequence detection is off, as for an
unpacked batch on a device: under fake tensors transformers cannot read the position ids and would build an S×S mask.
The decoder is fed the embedding's output (a tensor that requires grad, as the trained embedding's does) rather
than token ids: the embedding's backward builds a vocabulary × width weight gradient (with an fp32 buffer on the
CPU kernel), once per step whatever the tokens; a weight gradient is a model state, counted with the others, and at
batch 1 that constant would read as bytes per token.

The decoder's layers are not run all at once: activations add up layer by layer, so each kind of layer (the
runtime's layer kinds: dense or MoE, sliding or global attention, linear-attention or state-space) is measured once
and scaled by how many layers of that kind the depth has (:func:`whole_depth`). The model is built with the fewest
first layers that hold every kind twice; what the second layer of a kind keeps across its forward is that kind's
bytes (the first may take the embedding's output), the rest of what the cut model keeps are the parts outside the
layers (the embedding's output, the rotary tables, the final norm), and backward's temporaries over what is kept are
one layer's at any depth. That costs seconds where running the whole depth cost minutes (a 94-layer MoE).

Bytes per token are linear in the sequence length, plus a constant per step that is no activation: :func:`measure`
runs three shapes and solves for the terms (:class:`~recipekit.recipe.sections.ActivationsSpec`). torch is imported
inside the functions: ``build`` reads the stored numbers only.
"""

from __future__ import annotations

import contextlib
import copy
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from recipekit.recipe.measured.unpacked import unpacked_batches
from recipekit.recipe.schema import validate
from recipekit.recipe.sections import ActivationsSpec
from recipekit.runtime.boundary.layerkinds import (
    LayerKind,
    cut_depth,
    decoder_layers,
    depth_keeping_every_kind,
    layer_kind,
    layer_kinds,
)

#: The two sequence lengths the import measures at (batch 1 at both, batch 2 at the first).
SEQUENCES = (512, 1024)
#: The memory tracker's categories that are activations: what forward creates, and what backward creates that is
#: not a gradient of a weight (the tracker files those under its GRAD category).
ACTIVATION_KINDS = ("ACT", "TEMP")


@dataclass(frozen=True)
class Sample:
    """Activation bytes of one forward and backward pass over ``micro_batch`` × ``seq_len`` tokens."""

    micro_batch: int
    seq_len: int
    checkpointing: bool
    kept: int  # alive at the end of forward
    peak: int  # the most alive at once, forward and backward
    before: dict[int, int] = field(default_factory=dict)  # alive as a watched decoder layer's forward begins

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len


def measure(
    config: Any, kinds: list[LayerKind] | None = None, sequences: tuple[int, int] = SEQUENCES
) -> ActivationsSpec:
    """Activation bytes per token of ``config``'s decoder, checkpointing off and on, from one layer of each kind
    (``kinds``: each layer's kind over the full depth, read off the meta model; None: built here to read them).
    Three shapes (batch 1 at two lengths, batch 2 at the first) solve bytes = C + tokens × (X + X_per_position × S)
    for all three terms."""
    kinds = kinds if kinds is not None else full_depth_kinds(config)
    numbers: dict[str, Any] = {"measured_by": "tracker_per_layer_kind"}
    short, long = sequences
    with fake_model(cut_depth(config, CutDepth.depth(kinds), modules=len(kinds))) as model:
        cut = CutDepth.of(model, kinds)
        for checkpointing, prefix in ((False, ""), (True, "checkpointed_")):
            shapes = ((1, short), (2, short), (1, long))
            samples = [whole_depth(cut, micro, seq, checkpointing=checkpointing) for micro, seq in shapes]
            for kind in ("kept", "peak"):
                one_short, two_short, one_long = (int(getattr(one, kind)) for one in samples)
                per_token, per_position = _solve(one_short, two_short, one_long, short, long)
                numbers[f"{prefix}{kind}"], numbers[f"{prefix}{kind}_per_position"] = per_token, per_position
    for prefix in ("", "checkpointed_"):  # the peak holds what is kept (a weight-sized constant can tilt its fit)
        for term in ("", "_per_position"):
            kept, peak = f"{prefix}kept{term}", f"{prefix}peak{term}"
            numbers[peak] = max(numbers[peak], numbers[kept])
    return validate(ActivationsSpec, numbers, root="model.activations")


def full_depth_kinds(config: Any) -> list[LayerKind]:
    """Each layer's kind over ``config``'s full depth (its model built on the meta device)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return layer_kinds(AutoModelForCausalLM.from_config(config, trust_remote_code=False))


@dataclass(frozen=True)
class CutDepth:
    """A model built with the fewest first layers that hold every kind twice (or once, where the full depth has one
    of it), and one more: the second layer of each kind the full depth has more of (``second``, its index; a layer
    follows it) and how many more of that kind the full depth has (``more``)."""

    model: Any
    second: dict[LayerKind, int]
    more: dict[LayerKind, int]

    @staticmethod
    def depth(kinds: list[LayerKind]) -> int:
        return min(len(kinds), depth_keeping_every_kind(kinds, times=2) + 1)

    @classmethod
    def of(cls, model: Any, kinds: list[LayerKind]) -> CutDepth:
        cut, full = [layer_kind(layer) for layer in decoder_layers(model)], Counter(kinds)
        if set(cut) != set(full):
            raise ValueError("the cut model's layer kinds are not the full depth's")
        more = {kind: full[kind] - cut.count(kind) for kind in full if full[kind] > cut.count(kind)}
        second = {kind: [i for i, k in enumerate(cut) if k == kind][1] for kind in more}
        return cls(model, second, more)


def whole_depth(cut: CutDepth, micro_batch: int, seq_len: int, *, checkpointing: bool) -> Sample:
    """The full depth's activation bytes from the cut model's: kept, plus what the second layer of each kind keeps
    (the bytes alive as the next layer begins minus as it began: its own input freed, its output the next one's
    input) times the layers of that kind the cut model lacks (the first of a kind can differ: it may take the
    embedding's output); peak, the full depth's kept plus the cut model's peak over its own kept (backward's
    temporaries of one layer, the layer rebuilt under checkpointing: the same at any depth)."""
    watch = tuple(sorted({i + step for i in cut.second.values() for step in (0, 1)}))
    one = sample(cut.model, micro_batch, seq_len, checkpointing=checkpointing, watch=watch)
    per_kind = {kind: one.before[i + 1] - one.before[i] for kind, i in cut.second.items()}
    kept = one.kept + sum(more * per_kind[kind] for kind, more in cut.more.items())
    return Sample(micro_batch, seq_len, checkpointing, kept=kept, peak=kept + one.peak - one.kept)


def measure_or_none(config: Any, kinds: list[LayerKind] | None = None) -> ActivationsSpec | None:
    """:func:`measure`, or None where a module cannot run under fake tensors (the estimate then uses its formula,
    and says so)."""
    try:
        return measure(config, kinds)
    except Exception:  # data-dependent control flow, an op without a fake kernel, a model that will not build
        return None


def _solve(one_short: int, two_short: int, one_long: int, short: int, long: int) -> tuple[int, int]:
    """(X, X_per_position) of bytes = C + tokens × (X + X_per_position × S) through batch 1 and 2 at ``short`` and
    batch 1 at ``long``. The constant C is left out: bytes once per step whatever the tokens (the largest weight's
    gradient, alive for an op before the tracker files it as a gradient) are no activation. A slope below zero is no
    attention term (rounding of small constants): the larger per-token figure is kept, per position nothing."""
    per_token_short = Fraction(two_short - one_short, short)
    constant = one_short - per_token_short * short
    per_token_long = (one_long - constant) / long
    per_position = (per_token_long - per_token_short) / (long - short)
    if per_position <= 0:
        return round(max(per_token_short, per_token_long)), 0
    return round(per_token_short - per_position * short), round(per_position)


@contextlib.contextmanager
def fake_model(config: Any) -> Iterator[Any]:
    """``config``'s causal LM built under ``FakeTensorMode`` on the CPU in bf16 (no memory), inside that mode; the
    experts implementation another build set on ``config`` (the FLOP counter's ``batched_mm``) is not kept."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(config)
    config._experts_implementation = None  # transformers' default: grouped_mm where the experts support it
    with FakeTensorMode(allow_non_fake_inputs=True), unpacked_batches(), device_attention():
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False, dtype=torch.bfloat16)
        model.train()
        yield model


@contextlib.contextmanager
def device_attention() -> Iterator[None]:
    """Scaled dot-product attention as a device runs it where the value heads are narrower than the query-key heads
    (MLA: DeepSeek-V3's 192 and 128). The CPU has no fused kernel for unequal widths and falls back to its math path,
    which keeps every S×S score for backward; a device's fused attention keeps a logsumexp per head instead (CUDA's
    memory-efficient kernel takes unequal widths; FlashAttention takes the value padded to the query's width, as
    transformers pads it). So the value is padded with zeros to the query's width, the fused path runs, and the
    output is cut back: what is kept is a padded value and output (a few percent of a layer), not S×S scores."""
    import torch
    import torch.nn.functional as functional

    original = functional.scaled_dot_product_attention

    def attention(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        narrower = query.shape[-1] - value.shape[-1]
        if narrower <= 0:
            return original(query, key, value, *args, **kwargs)
        padded = torch.nn.functional.pad(value, (0, narrower))
        return original(query, key, padded, *args, **kwargs)[..., : value.shape[-1]]

    functional.scaled_dot_product_attention = attention
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original


def sample(model: Any, micro_batch: int, seq_len: int, *, checkpointing: bool, watch: tuple[int, ...] = ()) -> Sample:
    """Track one forward and backward pass of ``model``'s decoder (its base model, from the embedding's output to the
    final norm) over ``micro_batch`` × ``seq_len`` tokens, and the bytes alive as each decoder layer at ``watch``
    begins its forward; ``model`` is one :func:`fake_model` gave, used inside its block."""
    import torch

    _set_checkpointing(model, checkpointing)
    decoder = model.base_model
    tracker = _activation_tracker()
    tracker.track_external(model)
    with tracker, _kept_across(model, watch, tracker) as across:
        width = model.get_input_embeddings().weight.shape[-1]
        embedded = torch.zeros((micro_batch, seq_len, width), dtype=torch.bfloat16, requires_grad=True)
        hidden = decoder(inputs_embeds=embedded, use_cache=False).last_hidden_state
        kept = tracker.activations_now()
        across.freeze()  # backward rebuilds checkpointed layers: their forward again, not what forward kept
        hidden.backward(torch.ones_like(hidden))
    model.zero_grad(set_to_none=True)
    return Sample(micro_batch, seq_len, checkpointing, kept=kept, peak=tracker.activation_peak, before=across.before)


class _Across:
    """Activation bytes alive when each watched layer's forward begins, until frozen."""

    def __init__(self, tracker: Any) -> None:
        self.tracker, self.before, self.frozen = tracker, dict[int, int](), False

    def freeze(self) -> None:
        self.frozen = True

    def enter(self, index: int) -> None:
        if not self.frozen:
            self.before[index] = self.tracker.activations_now()


@contextlib.contextmanager
def _kept_across(model: Any, watch: tuple[int, ...], tracker: Any) -> Iterator[_Across]:
    """Hooks on the decoder layers at ``watch`` that record the activation bytes alive as each begins its forward."""
    across = _Across(tracker)
    layers = decoder_layers(model)
    handles = [layers[index].register_forward_pre_hook(lambda *_a, i=index: across.enter(i)) for index in watch]
    try:
        yield across
    finally:
        for handle in handles:
            handle.remove()


def _set_checkpointing(model: Any, on: bool) -> None:
    """Hugging Face's gradient checkpointing: one checkpoint per decoder layer, non-reentrant (the Trainer's)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers renames these to activation_checkpointing_*
        if on:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_disable()


def _activation_tracker() -> Any:
    """A MemTracker that follows the peak of its activation categories alone, in place of its own peaks (of the
    total, weights and gradients included, whose moment need not be the activations', and per module: the tracker
    walks every module after every op for those, which costs minutes on a real model's depth)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class ActivationTracker(MemTracker):
        activation_peak = 0

        def activations_now(self) -> int:
            snapshot = self.get_tracker_snapshot("current")
            return sum(_activation_bytes(per_kind) for per_kind in snapshot.values())

        def _update_peak_stats(self, peak_state: Any) -> None:
            now = sum(_activation_bytes(per_kind) for per_kind in self._curr_mem_snap.values())
            self.activation_peak = max(self.activation_peak, now)

    return ActivationTracker()


def _activation_bytes(per_kind: dict[Any, int]) -> int:
    """The activation categories' bytes of one device's tracker snapshot (keys are the tracker's enum members)."""
    return sum(size for kind, size in per_kind.items() if getattr(kind, "name", None) in ACTIVATION_KINDS)
