"""Training FLOPs per token, measured with torch's FLOP counter over the real transformers module on the meta device
(on the CPU with real tensors where a module cannot run on meta).

recipekit has one FLOPs definition: what ``torch.utils.flop_counter.FlopCounterMode`` counts over one forward and
backward pass of the model transformers builds. Every matmul counts (the output head too when it is tied to the
embedding: it is a matmul, only the embedding lookup is free); attention is what the counter counts for scaled
dot-product attention, dense S×S whatever the mask, over heads × head_dim; an MoE layer's experts run through
transformers' ``batched_mm`` experts implementation, which gathers each token's top-k experts and so counts exactly
the FLOPs a token routes through (and runs on the meta device). Recomputation is kept apart.

A sequence's count is a polynomial of second degree in its length S: attention's S×S products, everything else
once a token, and a few FLOPs once a sequence (a causal convolution's padding, prompt tokens a model prepends). So
per token it is ``X + X_per_position × S + X_per_sequence / S``: :func:`measure` runs the model at three lengths and
solves for the three terms exactly (:class:`~recipekit.recipe.sections.FlopsSpec`). The lengths are short
(:func:`sequences`): on the meta device a vectorized module costs the same at any length, but a state-space or
recurrent reference scan loops over the positions, so a long sequence costs minutes. Chunked kernels (linear
attention, Mamba-2's SSD) pad a sequence to a whole chunk, so the lengths are whole multiples of the largest chunk
the config names (64 at least: transformers' torch chunked delta rules chunk by 64); at a multiple nothing is padded
and every length that is one follows exactly.

On the meta device, transformers' packed-sequence check, which reads position ids' values, is given its known answer
for the one sequence the counter feeds, and a rotary embedding that reads the positions' values (LongRoPE) computes on
the CPU from those known positions (:func:`counting`). Where a module still cannot run there (a ``Tensor.item()`` on
data, a tensor made on the CPU), the same counter counts the same (depth-cut) model
built on the CPU with real tensors, within a memory budget checked before anything is allocated
(:data:`CPU_BUDGET_BYTES`: the cut's weights and their gradients, and the activations of the longest counting
sequence, :func:`cpu_bytes`); its experts run transformers' ``eager`` implementation there, which routes each token
through its top-k experts as ``batched_mm`` does (the same FLOPs) without gathering a copy of every expert's weights
per token. Over the budget, or where that fails too, :func:`analytic` gives the same convention from the parameter
counts, and the import says why. The option's ``counted_by`` says which: ``counter``, ``counter_cpu`` or
``analytic``.
torch is imported inside the functions that need it: the plan reads the stored numbers only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from recipekit.recipe.measured.unpacked import rotary_on_known_positions, unpacked_batches
from recipekit.recipe.schema import validate
from recipekit.recipe.sections import FlopsSpec
from recipekit.runtime.boundary.layerkinds import (
    decoder_layers,
    decoder_layers_path,
    depth_keeping_every_kind,
    layer_kinds,
    shortest_cut,
)

#: The shortest chunk the import's lengths are multiples of (transformers' torch chunked gated delta rules chunk by 64).
CHUNK = 64
#: Config keys that name a chunk a kernel pads a sequence to (Mamba-2's ``chunk_size``, Bamba's ``mamba_chunk_size``,
#: MiniMax's lightning-attention ``block_size``).
_CHUNK_KEY = re.compile(r"(chunk_size|block_size)$")
#: What the counter counts per matmul parameter per token: 2 forward; 2 more for the input gradient and 2 for the
#: weight gradient in backward (the analytic count uses these; the counter finds them on its own).
FORWARD_PER_PARAM, INPUT_GRAD_PER_PARAM, WEIGHT_GRAD_PER_PARAM = 2, 2, 2
#: The memory the count on the CPU may take, where the meta device cannot run a model: the depth-cut model's weights,
#: their gradients and the activations of the longest counting sequence (:func:`cpu_bytes`), checked before anything
#: is allocated; 8 GiB, what a workstation or a CI runner spares. Depth-cut models are small (every one the sweep
#: counts on the CPU is under 2 GiB of weights); a cut past the budget (one holding a huge MoE layer's every expert)
#: is counted analytically.
CPU_BUDGET_BYTES = 8 * 2**30
#: What the activations of a counting pass are estimated at, per token and per element of every weight's inputs and
#: outputs it touches, over the one stored: what autograd keeps for the backward pass, with room to spare.
ACTIVATION_MARGIN = 4


class TooLargeForCpu(Exception):
    """A model the import does not build on the CPU to count: it needs more than :data:`CPU_BUDGET_BYTES`."""


@dataclass(frozen=True)
class Sample:
    """FLOPs of one sequence of ``seq_len`` tokens (batch 1), as the counter counts them."""

    seq_len: int
    train: int  # forward + backward, every weight training
    frozen: int  # forward + the activation gradients down to the embedding output, no weight gradient
    recompute: int  # forward of the decoder layers alone


def sequences(config: Any) -> tuple[int, int, int]:
    """The three lengths the import measures at: 1, 2 and 3 times the largest chunk the config names (at least
    :data:`CHUNK`), so no chunked kernel pads and the counts are exact at every multiple."""
    named = [
        value
        for key, value in config.to_dict().items()
        if _CHUNK_KEY.search(key) and isinstance(value, int) and not isinstance(value, bool) and value > 0
    ]
    unit = max([CHUNK, *named])
    return unit, 2 * unit, 3 * unit


def measure(model: Any, lengths: tuple[int, int, int] | None = None) -> FlopsSpec:
    """The counter's FLOPs per token of ``model`` (a causal LM on the meta device), solved from three lengths
    (:func:`sequences` of its config unless given).

    The counter runs over the fewest first layers that hold every kind of layer (:class:`DepthCut`), and each layer
    beyond them counts what the counter counted for the first layer of its kind: a 61-layer model costs the counter
    4 layers, and nothing is estimated (a layer's FLOPs depend on its kind, not on its depth). Where a module cannot
    run on the meta device, the same counting runs on the CPU (:func:`on_cpu`, ``counted_by: counter_cpu``); where
    the model is too large for that (:class:`TooLargeForCpu`) or it fails there too, the exception reaches the caller,
    which counts analytically."""
    lengths = lengths or sequences(model.config)
    cut = DepthCut.of(model)
    try:
        samples, counted_by = _samples(model, cut, lengths), "counter"
    except Exception:  # a module that cannot run on meta (Tensor.item(), a tensor made on the CPU)
        samples, counted_by = _samples_on_cpu(model, cut, lengths), "counter_cpu"
    return _solved(samples, counted_by)


def _solved(samples: list[Sample], counted_by: str) -> FlopsSpec:
    numbers: dict[str, Any] = {"counted_by": counted_by}
    for kind in ("train", "frozen", "recompute"):
        terms = _solve([(s.seq_len, getattr(s, kind)) for s in samples])
        numbers[f"{kind}_per_sequence"], numbers[kind], numbers[f"{kind}_per_position"] = terms
    return validate(FlopsSpec, numbers, root="model.flops")


def _samples(model: Any, cut: DepthCut | None, lengths: tuple[int, ...]) -> list[Sample]:
    """The full depth's :class:`Sample` at each length: over ``cut`` where there is one, else over ``model``."""
    with counting(cut.model if cut is not None else model):
        if cut is None:
            return [sample(model, seq_len) for seq_len in lengths]
        return [cut.sample(seq_len) for seq_len in lengths]


def _samples_on_cpu(model: Any, cut: DepthCut | None, lengths: tuple[int, ...]) -> list[Sample]:
    """:func:`_samples` with the counted model (the cut where there is one) built again on the CPU. The random
    generator is forked and seeded: a data-dependent module (an MoE router) sees the same weights at every import."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        real = on_cpu(cut.model if cut is not None else model, max(lengths))
        return _samples(real, replace(cut, model=real) if cut is not None else None, lengths)


def on_cpu(model: Any, seq_len: int = 3 * CHUNK) -> Any:
    """``model`` (a causal LM on the meta device) built again on the CPU with real, randomly initialized tensors, for
    the counter where the meta device cannot run a module of it; FLOP counts do not depend on the dtype. float32
    where the count fits in :data:`CPU_BUDGET_BYTES` (every CPU kernel has it: XLNet adds float32 tensors of its own
    and fails in bfloat16), bfloat16 where only that fits (:func:`cpu_bytes` at ``seq_len``, the longest counting
    sequence); :class:`TooLargeForCpu` beyond, before anything is allocated. The experts run transformers' ``eager``
    implementation: each token through its top-k experts, as ``batched_mm`` counts on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    needed = {dtype: cpu_bytes(model, seq_len, dtype.itemsize) for dtype in (torch.float32, torch.bfloat16)}
    fitting = [dtype for dtype, size in needed.items() if size <= CPU_BUDGET_BYTES]
    if not fitting:
        raise TooLargeForCpu(
            f"counting it on the CPU would need {needed[torch.bfloat16] / 2**30:.1f} GiB in bfloat16 (the depth-cut "
            f"model's weights, their gradients and the activations), over the budget of "
            f"{CPU_BUDGET_BYTES / 2**30:g} GiB"
        )
    with torch.device("cpu"):
        return AutoModelForCausalLM.from_config(model.config, experts_implementation="eager", dtype=fitting[0])


def cpu_bytes(model: Any, seq_len: int, itemsize: int) -> int:
    """What counting ``model`` (on the meta device: shapes only) on the CPU takes at ``itemsize`` bytes an element:
    its weights and their gradients (the largest twice more, while it is summed), and the activations of one sequence
    of ``seq_len`` tokens, estimated from the weights' shapes (each matrix's inputs and outputs per token, a routed
    expert's only for the top-k experts a token uses, :data:`ACTIVATION_MARGIN` times), plus attention's S × S scores
    per head and layer and the logits."""
    config = model.config
    params = sum({id(p): p.numel() for p in model.parameters()}.values())
    top_k = int(getattr(config, "num_experts_per_tok", 0) or 0)
    per_token = 0
    for parameter in {id(p): p for p in model.parameters()}.values():
        shape = tuple(parameter.shape)
        if len(shape) == 2:
            per_token += shape[0] + shape[1]
        elif len(shape) == 3:  # fused experts: (experts, out, in); a token uses top-k of them
            per_token += min(shape[0], top_k or shape[0]) * (shape[1] + shape[2])
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    layers = len(decoder_layers(model)) or 1
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    activations = ACTIVATION_MARGIN * itemsize * seq_len * (per_token + heads * layers * seq_len)
    logits = 3 * 4 * seq_len * vocab  # float32 logits, their softmax and its gradient
    # the largest weight's gradient twice more while it is summed (an expert's slice of a fused tensor has a
    # gradient the size of the whole tensor)
    largest = max((p.numel() for p in model.parameters()), default=0)
    return (2 * params + 2 * largest) * itemsize + activations + logits


@contextmanager
def counting(model: Any) -> Iterator[None]:
    """What the counter's pass over ``model`` needs of its device, so that the meta device and the CPU count alike.

    On the CPU, attention runs through the math backend of scaled dot-product attention: the counter has no FLOPs
    formula for the CPU's flash kernel (``_scaled_dot_product_flash_attention_for_cpu``: it would count 0), and the
    math backend runs the two S×S matmuls the meta device counts. On the meta device, transformers' check for packed
    sequences is answered (:func:`.unpacked.unpacked_batches`), and a rotary embedding computes from the positions fed
    (:func:`.unpacked.rotary_on_known_positions`)."""
    if model.device.type == "meta":
        with unpacked_batches(), rotary_on_known_positions(model):
            yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        yield


@dataclass(frozen=True)
class DepthCut:
    """``model`` cut to the fewest first layers that hold every kind its depth has, and how many more layers of each
    kind the full depth has (``extra``: the cut's first layer of that kind by its counter name → how many more)."""

    model: Any
    extra: dict[str, int]

    @classmethod
    def of(cls, model: Any) -> DepthCut | None:
        """The cut of ``model`` (:func:`~recipekit.runtime.boundary.layerkinds.shortest_cut`), or None where the
        full depth is no longer (or no cut config builds as the same first layers)."""
        kinds = layer_kinds(model)
        built: list[Any] = []

        def builds(config: Any) -> bool:
            import torch
            from transformers import AutoModelForCausalLM

            try:
                with torch.device("meta"):
                    cut = AutoModelForCausalLM.from_config(config, experts_implementation="batched_mm")
            except Exception:  # a config whose per-layer settings the cut does not follow
                return False
            built[:] = [cut, layer_kinds(cut)]
            return built[1] == kinds[: len(built[1])]

        if (
            not kinds
            or depth_keeping_every_kind(kinds) >= len(kinds)
            or shortest_cut(model.config, kinds, builds) is None
        ):
            return None
        cut, cut_kinds = built
        if len(cut_kinds) >= len(kinds):
            return None
        path = f"{type(cut).__name__}.{decoder_layers_path(cut)}"
        first = {kind: f"{path}.{kinds.index(kind)}" for kind in set(kinds)}
        return cls(cut, {first[kind]: kinds.count(kind) - cut_kinds.count(kind) for kind in first})

    def sample(self, seq_len: int) -> Sample:
        """The full depth's :class:`Sample`: the cut's, plus each further layer counted as its kind's first."""
        whole, layers = _without_cache_on_failure(_sample_by_layer, self.model, seq_len)
        more = {kind: sum(getattr(layers[name], kind) * n for name, n in self.extra.items()) for kind in _KINDS}
        return Sample(seq_len, **{kind: getattr(whole, kind) + more[kind] for kind in _KINDS})


_KINDS = ("train", "frozen", "recompute")


def _solve(points: list[tuple[int, int]]) -> tuple[int, int, int]:
    """(c, a, p) of a sequence's count c + a × S + p × S² through three measured (S, count) points (divided
    differences, exact in fractions): per token, X = a, X_per_position = p, X_per_sequence = c."""
    (s1, t1), (s2, t2), (s3, t3) = points
    first, second = Fraction(t2 - t1, s2 - s1), Fraction(t3 - t2, s3 - s2)
    per_position = (second - first) / (s3 - s1)
    per_token = first - per_position * (s1 + s2)
    per_sequence = t1 - per_token * s1 - per_position * s1 * s1
    return round(per_sequence), round(per_token), round(per_position)


def sample(model: Any, seq_len: int) -> Sample:
    """Count one training step's FLOPs over a sequence of ``seq_len`` tokens (batch 1) under the counter.

    One forward pass serves both backward passes: first the gradients of the embedding output alone (autograd then
    skips every weight gradient: the frozen base of a LoRA run, as PEFT runs it under checkpointing, which makes the
    embedding output require grad), then the full backward pass of full training."""
    return _without_cache_on_failure(_sample, model, seq_len)


def _without_cache_on_failure(count: Any, model: Any, seq_len: int) -> Any:
    """``count(model, seq_len)``; a model that cannot make its decoding cache runs without one (training never
    decodes)."""
    try:
        return count(model, seq_len)
    except Exception:  # a hybrid whose decoding cache holds no attention layer (Bamba) fails to make one: train without
        if not getattr(model.config, "use_cache", False):
            raise
    model.config.use_cache = False
    try:
        return count(model, seq_len)
    finally:
        model.config.use_cache = True


def _sample(model: Any, seq_len: int) -> Sample:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model.train()
    embedded: list[Any] = []
    hook = model.get_input_embeddings().register_forward_hook(lambda _m, _i, out: embedded.append(out))
    ids = torch.zeros((1, seq_len), dtype=torch.long, device=model.device)
    forward, frozen, backward = (FlopCounterMode(display=False) for _ in range(3))
    try:
        with forward:
            loss = model(input_ids=ids, labels=ids).loss
    finally:
        hook.remove()
    with frozen:
        torch.autograd.grad(loss, embedded, retain_graph=True)
    with backward:
        loss.backward()
    model.zero_grad(set_to_none=True)
    ahead = forward.get_total_flops()
    return Sample(
        seq_len=seq_len,
        train=ahead + backward.get_total_flops(),
        frozen=ahead + frozen.get_total_flops(),
        recompute=_layers_forward(model, _per_module(forward)),
    )


def _sample_by_layer(model: Any, seq_len: int) -> tuple[Sample, dict[str, Sample]]:
    """:func:`_sample`'s counts, and each decoder layer's own (by the counter's module name).

    The counter gives a module the backward FLOPs of its forward only when the counter that saw the forward sees the
    backward too (its module tracker hooks the backward during the forward). So one counter sees the whole step, and
    its counts are read between the phases: after the forward (the recomputation), after the embedding output's
    gradients (frozen: forward and that backward) and after the full backward (train: forward and the full backward,
    less the frozen backward read before it). One forward pass serves all three, as in :func:`_sample`."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model.train()
    ids = torch.zeros((1, seq_len), dtype=torch.long, device=model.device)
    embedded: list[Any] = []
    hook = model.get_input_embeddings().register_forward_hook(lambda _m, _i, out: embedded.append(out))
    counter = FlopCounterMode(display=False)
    try:
        with counter:
            loss = model(input_ids=ids, labels=ids).loss
            forward = _per_module(counter)
            torch.autograd.grad(loss, embedded, retain_graph=True)
            frozen = _per_module(counter)
            loss.backward()
            step = _per_module(counter)
    finally:
        hook.remove()
    model.zero_grad(set_to_none=True)
    train = {name: step[name] - frozen.get(name, 0) + forward.get(name, 0) for name in step}
    checkpointed = _checkpointed(model)
    recompute = {name: flops if name in checkpointed else 0 for name, flops in forward.items()}
    whole = Sample(seq_len, train[_TOTAL], frozen[_TOTAL], _layers_forward(model, forward))
    names = set().union(train, frozen, recompute) - {_TOTAL}
    counts = (train, frozen, recompute)
    return whole, {name: Sample(seq_len, *(c.get(name, 0) for c in counts)) for name in names}


#: The counter's name for the whole step's count among its per-module ones.
_TOTAL = "Global"


def _per_module(counter: Any) -> dict[str, int]:
    """The FLOPs the counter has counted so far, per module name (and the whole step's under :data:`_TOTAL`)."""
    return {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}


def _layers_forward(model: Any, forward: dict[str, int]) -> int:
    """The forward FLOPs (``forward``: :func:`_per_module` of a forward pass) of the modules transformers' gradient
    checkpointing wraps (its decoder layers)."""
    return sum(forward.get(name, 0) for name in _checkpointed(model))


def _checkpointed(model: Any) -> set[str]:
    """The counter's names (the root's class, then the module's path) of the modules transformers' gradient
    checkpointing wraps: none where a model's layers are not ``GradientCheckpointingLayer`` (XLNet's), whose
    recomputation is then 0 at every depth."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    wrapped = [name for name, module in model.named_modules() if isinstance(module, GradientCheckpointingLayer)]
    return {f"{type(model).__name__}.{name}" for name in wrapped}


def analytic(*, matmul_params: int, head_params: int, layers: int, attention_width: int) -> FlopsSpec:
    """The counter's convention as arithmetic, for a model the counter cannot run.

    ``matmul_params``: the weights one token multiplies with (the active ones, the head included even when tied, not
    the embedding lookup, not norms); ``head_params`` of them the output head's (not recomputed: checkpointing
    wraps the decoder layers); ``attention_width``: one layer's query heads × (query-key head_dim + value head_dim).
    Attention's two S×S products cost 2 × S × ``attention_width`` per token forward and twice that backward.
    """
    forward, backward = FORWARD_PER_PARAM, INPUT_GRAD_PER_PARAM + WEIGHT_GRAD_PER_PARAM
    attention = 2 * layers * attention_width
    numbers = {
        "counted_by": "analytic",
        "train": (forward + backward) * matmul_params,
        "train_per_position": 3 * attention,
        "frozen": (forward + INPUT_GRAD_PER_PARAM) * matmul_params,
        "frozen_per_position": 3 * attention,
        "recompute": forward * (matmul_params - head_params),
        "recompute_per_position": attention,
    }
    return validate(FlopsSpec, numbers, root="model.flops")
