"""Activation memory against a real run on the CPU (issue 29, item 3, its second half): the numbers `model import`
stores (model.activations, from torch's MemTracker under FakeTensorMode) predict what one real forward and backward of
each twin's decoder allocates on the CPU, with real random bf16 weights, at three shapes none of them the import's.

The run is modelmemory.sample's, for real: the embedding's output (zeros that require grad) into the decoder,
``use_cache=False``, Hugging Face checkpointing (non-reentrant) off and on, every weight training, MoE experts as
grouped GEMMs. It runs on one CPU thread: the CPU flash-attention backward's scratch is per thread (with two threads a
tiny Llama's real peak at 1 × 768 is 30% over the tracker's, all of it those blocks; with one, the same to the byte),
and one thread gives the same bytes on any machine.

How the real bytes are measured, independently of the tracker and of fake tensors: ``torch.profiler`` with
``profile_memory=True`` records every allocation and free the CPU allocator makes for the real kernels (address, bytes,
time, the ops around it). Activation bytes are everything allocated inside the step but the weights' gradients, told
apart by address: each parameter's ``.grad`` storage after backward is the last block allocated there. ``kept`` is
what is alive when backward begins (a ``record_function`` mark), ``peak`` the most alive at once. The profiler's own
categories (``prof._memory_profile()``) do cover CPU tensors, and on the tiny Llama their bytes other than parameters
and gradients peak within 32 bytes of this count; but they are inferred from a rebuilt data-flow graph (some bytes go
uncategorized for a while) and file the input's gradient as GRADIENT with the weights' (the tracker counts it as a
temporary, which it is for a step), where an address needs no inference. Saved-tensor hooks see what autograd saves,
not outputs, temporaries or kernel scratch, and give no peak.

Tolerance reached, real run against the stored numbers × tokens (micro batch 1 to 4, 512 to 1536 positions, six
catalog twins and the Gemma-3 and DeepSeek-V3 generic twins):

* kept, checkpointing off: within 1.7% (:data:`KEPT_TOLERANCE`): tensors one per position that the micro batch
  shares (the rotary tables) the import's fit cannot place, as for the tracker at the same shapes;
* kept, checkpointing on: within 15.6% (:data:`CHECKPOINTED_KEPT_TOLERANCE`): the same tables weigh most when a
  width-64 layer keeps only its input (736 bytes a token), and the Gemma twin's per-position term (1.63 bytes,
  stored as 2) puts its prediction at 1536 positions 15% over; on a full-size model both are well under 1%;
* peak, what the estimate uses: within 3.6% checkpointing off and 5.75% on (:data:`PEAK_TOLERANCE`), the rest of
  the import's fit (the DeepSeek twin's at 4 × 512, the Gemma twin's at 1 × 1536) and, on the tiny Mixtral, 4.5 to
  5.75% of real bytes no tracker sees (below).

Why the real run differs from the tracker, checked at one shape (:data:`TRACKED_SHAPE`): it keeps exactly the
tracker's bytes plus, with checkpointing, the CPU RNG state each checkpointed layer saves (5,056 bytes a layer a step,
CPU memory on a device too) and a Python number made a tensor outside any op (8 bytes): neither passes the dispatcher
the tracker watches. Its peak is at least the tracker's less copies only a dispatch mode brings about: under one (the
tracker's, fake tensors') autograd's backward formulas take every tensor for a subclass and write out of place what
they write in place into a plain tensor (the MoE router's top-k backward scatter: 24 KiB, 0.35% of the tiny
Qwen3-MoE's checkpointed peak). It is at most the tracker's plus what the op running at the peak has allocated by
then: its output and the temporaries inside its kernel (the CPU flash-attention backward's blocks, the bf16 GEMM's
scratch, the cast inside Mixtral's bf16 × fp32 routing-weight multiply), which an op-level tracker cannot see and
fake tensors do not have. A device's kernels have their own (FlashAttention's backward accumulates dq in fp32, cuBLAS
its workspace), outside the stored numbers in the same way.

Shapes run from the import's shortest sequence (512) up: below it the stored lines are extrapolated, and on a twin
that fails (per-position terms rounded to whole bytes; a peak whose moment moves from the MLP to attention as the
sequence grows: at 4 × 64 the DeepSeek twin's checkpointed peak is a third under the real run's).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "src"))

from recipekit.recipe.schema import validate  # noqa: E402
from recipekit.recipe.sections import ActivationsSpec  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from recipekit.recipe.measured import modelmemory  # noqa: E402
from recipekit.runtime.boundary import layerkinds  # noqa: E402
from recipekit.runtime.model.shrink import twin_config  # noqa: E402

#: (micro batch, sequence length): none of them the import's own (batch 1 at 512 and 1024, batch 2 at 512).
SHAPES = ((1, 1536), (2, 768), (4, 512))
#: The shape the real run is also set against the tracker at (one of :data:`SHAPES`).
TRACKED_SHAPE = (2, 768)
#: Relative difference allowed between the stored numbers' prediction and the real run (reached: 1.7%, 15.6%, 5.75%).
KEPT_TOLERANCE = 0.02
CHECKPOINTED_KEPT_TOLERANCE = 0.17
PEAK_TOLERANCE = 0.06
#: Bytes the real run keeps that no op made: Python numbers made tensors (8 bytes in the DeepSeek twin).
OUTSIDE_ANY_OP = 64
#: Of the tracker's peak, the share that copies made only under a dispatch mode may take (autograd's formulas write
#: out of place for a subclass what they write in place into a plain tensor): reached 0.35%, the tiny Qwen3-MoE's.
MODE_ONLY_COPIES = 0.01
#: The catalog's tiny options (their transformers config under ``config``), and model types whose generic twin
#: (``twin_config``: widths shrunk, depth cut to the shortest run keeping every layer kind) has more than one kind.
CATALOG_TWINS = ("tiny_llama", "tiny_qwen2", "tiny_qwen3", "tiny_qwen3_moe", "tiny_mixtral", "tiny_glm4")
GENERIC_TWINS = ("gemma3_text", "deepseek_v3")
#: The profiler event that marks the end of forward.
BACKWARD = "recipekit::backward"


@dataclass(frozen=True)
class RealSample:
    """Activation bytes the CPU allocator gave one real forward and backward pass."""

    kept: int  # alive when backward begins
    peak: int  # the most alive at once
    in_flight: int  # of the peak, what the op running then had allocated since it began


@dataclass(frozen=True)
class Allocation:
    """One allocator event: ``size`` bytes at ``ptr`` (negative: freed), and when the outermost op around it began
    (the op the tracker sees whole; the event's own time where no op is around it)."""

    time_ns: int
    ptr: int
    size: int
    op_start_ns: int


# ------------------------------------------------------------------------------------------------ the twins
@functools.cache
def twin(name: str) -> tuple[object, ActivationsSpec]:
    """The twin's transformers config and the activation numbers the import stores for it: the catalog option's
    own, or, for a generic twin, what :func:`modelmemory.measure` gives (the function the import calls)."""
    if name in GENERIC_TWINS:
        config = twin_config(transformers.AutoConfig.for_model(name), 256)
        return config, modelmemory.measure(config)
    option = yaml.safe_load((ROOT / "recipes" / "model" / f"{name}.yaml").read_text())
    raw = dict(option["config"])
    config = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)
    return config, validate(ActivationsSpec, option["activations"], root="model.activations")


def real_model(config: object) -> object:
    """``config``'s causal LM with real random bf16 weights on the CPU, built as :func:`modelmemory.fake_model`
    builds it (the default experts implementation, training mode), from a fixed seed: the routing is the same at
    every run."""
    config = copy.deepcopy(config)
    config._experts_implementation = None
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=False, dtype=torch.bfloat16)
    model.train()
    return model


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """One CPU thread for torch: the CPU kernels' scratch (flash attention's blocks) is per thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@functools.cache
def real_runs(name: str) -> dict[tuple[int, int, bool], RealSample]:
    """The real run at every shape of :data:`SHAPES`, checkpointing off and on."""
    model = real_model(twin(name)[0])
    with one_thread():
        return {
            (micro, seq, on): real_sample(model, micro, seq, checkpointing=on)
            for on in (False, True)
            for micro, seq in SHAPES
        }


# ------------------------------------------------------------------------------------------------ the real bytes
def real_sample(model: object, micro_batch: int, seq_len: int, *, checkpointing: bool) -> RealSample:
    """One real forward and backward of ``model``'s decoder, as :func:`modelmemory.sample` runs it under fake
    tensors (attention as a device runs it: :func:`modelmemory.device_attention`), with every allocation the CPU
    allocator makes recorded by the profiler."""
    from torch.profiler import ProfilerActivity, profile, record_function

    modelmemory._set_checkpointing(model, checkpointing)
    width = model.get_input_embeddings().weight.shape[-1]
    with modelmemory.device_attention(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        embedded = torch.zeros((micro_batch, seq_len, width), dtype=torch.bfloat16, requires_grad=True)
        hidden = model.base_model(inputs_embeds=embedded, use_cache=False).last_hidden_state
        with record_function(BACKWARD):
            hidden.backward(torch.ones_like(hidden))
    gradients = {param.grad.untyped_storage().data_ptr() for param in model.parameters() if param.grad is not None}
    model.zero_grad(set_to_none=True)
    events, backward_ns = allocations(prof)
    return account(events, backward_ns, gradients)


def allocations(prof: object) -> tuple[list[Allocation], int]:
    """The profile's CPU allocator events in time order, and when backward began (from the profiler's event tree,
    the record torch's own memory profiler reads)."""
    from torch._C._profiler import _EventType

    events, backward_ns = [], None
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.name == BACKWARD:
            backward_ns = event.start_time_ns
        if event.typed[0] == _EventType.Allocation and event.typed[1].device.type == "cpu":
            fields = event.typed[1]
            events.append(Allocation(event.start_time_ns, fields.ptr, fields.alloc_size, _op_start(event)))
    assert backward_ns is not None, "the profile lost the mark of backward"
    return sorted(events, key=lambda one: one.time_ns), backward_ns


def _op_start(event: object) -> int:
    """When the outermost aten op around ``event`` began: the op the tracker sees whole (ops its kernel calls, such
    as the ``aten::empty`` of its scratch, the tracker never sees)."""
    start, parent = event.start_time_ns, event.parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            start = parent.start_time_ns
        parent = parent.parent
    return start


def account(events: list[Allocation], backward_ns: int, gradients: set[int]) -> RealSample:
    """Bytes alive over the step, the weights' gradients left out: the last block allocated at each gradient's
    address is that gradient (it is alive at the end), counted as a model state from its first byte."""
    last_at = {event.ptr: index for index, event in enumerate(events) if event.size > 0}
    weight_gradients = {last_at[ptr] for ptr in gradients if ptr in last_at}
    alive: dict[int, Allocation] = {}
    total, kept, peak, in_flight = 0, None, 0, 0
    for index, event in enumerate(events):
        if kept is None and event.time_ns >= backward_ns:
            kept = total
        if event.size > 0 and index not in weight_gradients:
            alive[event.ptr], total = event, total + event.size
        elif event.size < 0 and event.ptr in alive:  # a block allocated before the step is none of its bytes
            total -= alive.pop(event.ptr).size
        if total > peak:
            peak = total
            in_flight = sum(one.size for one in alive.values() if one.time_ns >= event.op_start_ns)
    assert kept is not None, "no allocator event after forward"
    return RealSample(kept=kept, peak=peak, in_flight=in_flight)


# ------------------------------------------------------------------------------------------------ the checks
def relative(measured: int, predicted: int) -> float:
    return measured / predicted - 1


@pytest.mark.parametrize("name", CATALOG_TWINS + GENERIC_TWINS)
def test_stored_activations_predict_a_real_run_on_the_cpu(name):
    """The stored bytes per token × tokens give what the real run keeps and its peak, at every shape, checkpointing
    off and on, within the tolerances the module docstring accounts for."""
    stored = twin(name)[1]
    for (micro, seq, checkpointing), real in real_runs(name).items():
        tokens, shape = micro * seq, (micro, seq, checkpointing)
        kept = tokens * stored.kept_at(seq, checkpointing=checkpointing)
        peak = tokens * stored.peak_at(seq, checkpointing=checkpointing)
        kept_tolerance = CHECKPOINTED_KEPT_TOLERANCE if checkpointing else KEPT_TOLERANCE
        assert abs(relative(real.kept, kept)) <= kept_tolerance, (shape, real.kept, kept)
        assert abs(relative(real.peak, peak)) <= PEAK_TOLERANCE, (shape, real.peak, peak)


@pytest.mark.parametrize("name", CATALOG_TWINS + GENERIC_TWINS)
def test_a_real_run_differs_from_the_tracker_only_by_what_no_op_level_tracker_sees(name):
    """At one shape, the real run against the tracker: kept exactly the same bytes but the RNG states checkpointing
    saves and Python numbers made tensors; the peak between the tracker's less the copies only its dispatch mode
    brings about and the tracker's plus what the op running at the real peak had allocated (its output and its
    kernel's scratch)."""
    config, (micro, seq) = twin(name)[0], TRACKED_SHAPE
    reals = [real_runs(name)[(micro, seq, checkpointing)] for checkpointing in (False, True)]
    rng_state = torch.get_rng_state().nbytes  # what checkpointing saves a layer (preserve_rng_state, on the CPU)
    with modelmemory.fake_model(config) as model:
        layers = len(layerkinds.decoder_layers(model))
        tracked = [modelmemory.sample(model, micro, seq, checkpointing=on) for on in (False, True)]
    for real, tracker, checkpointing in zip(reals, tracked, (False, True)):
        rng_states = rng_state * layers if checkpointing else 0
        assert 0 <= real.kept - tracker.kept - rng_states <= OUTSIDE_ANY_OP, (checkpointing, real, tracker)
        assert tracker.peak <= real.peak * (1 + MODE_ONLY_COPIES), (checkpointing, real, tracker)
        ceiling = tracker.peak + real.in_flight + rng_states + OUTSIDE_ANY_OP
        assert real.peak <= ceiling, (checkpointing, real, tracker)
