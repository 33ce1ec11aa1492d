"""What a pass without data cannot compute, answered from what it is known to feed: transformers' packed-sequence
check ("none packed"), and the rotary embeddings computed on the CPU from the positions fed (0 to S-1).

A model that trains without a decoding cache has transformers look for packed sequences in its position ids
(``masking_utils.find_packed_sequence_indices``), which reads their values. The meta device and fake tensors have
none (``Tensor.item()`` fails: Bamba, HRM, Inkling), and under fake tensors transformers would otherwise build an S×S
mask. The measurements here feed unpacked batches (positions 0 to S-1 in each row), whose answer is known: None, what
the check returns for them on real tensors and what a device sees for an unpacked batch
(tests/unit/recipe/test_model_flops.py compares a count on meta with one on the CPU, where the real check runs).

A rotary embedding may read the positions' values too: LongRoPE (Phi-3.5-MoE, Phi-3) picks its short or long factors
by the largest position, with a ``Tensor.item()``. It holds no parameter and its output depends on the positions
alone, which are known (the counter and the tracker feed no position ids: each row is 0 to S-1, as transformers
makes them from the cache positions). :func:`rotary_on_known_positions` has each such module compute its cos and
sin on the CPU from those positions and hands them to the pass on its device: the same numbers, and the same FLOPs
(the FLOP counter counts an op whatever its device; tests/unit/recipe/test_model_import_bounds.py compares such a
count with one of the whole model on the CPU).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def unpacked_batches() -> Iterator[None]:
    """Inside the block, transformers' packed-sequence check answers None (nothing to answer where it has none)."""
    from transformers import masking_utils

    check = getattr(masking_utils, "find_packed_sequence_indices", None)
    if check is None:
        yield
        return
    masking_utils.find_packed_sequence_indices = lambda *_args, **_kwargs: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = check


@contextlib.contextmanager
def rotary_on_known_positions(model: Any) -> Iterator[None]:
    """Inside the block, each parameter-free rotary embedding of ``model`` (on the meta device) computes on the CPU,
    from the positions 0 to S-1 its input's shape gives, a copy of itself built from the model's config; its output
    goes back to the meta device. A rotary class that cannot be built that way is left as it is."""
    import torch

    patched: list[tuple[Any, Any]] = []
    for module in model.modules():
        if not type(module).__name__.endswith("RotaryEmbedding") or any(True for _ in module.parameters()):
            continue
        try:
            with torch.device("cpu"):
                twin = type(module)(config=module.config)
        except Exception:  # a rotary class built from other arguments
            continue
        patched.append((module, module.forward))
        module.forward = _on_known_positions(module.forward, twin)
    try:
        yield
    finally:
        for module, forward in patched:
            module.forward = forward


def _on_known_positions(forward: Any, twin: Any) -> Any:
    import torch

    def answered(x: Any, position_ids: Any = None, *args: Any, **kwargs: Any) -> Any:
        if x.device.type != "meta" or position_ids is None:
            return forward(x, position_ids, *args, **kwargs)
        positions = torch.arange(position_ids.shape[-1]).expand(tuple(position_ids.shape))
        try:
            out = twin(torch.zeros(1, dtype=x.dtype), positions, *args, **kwargs)
        except Exception:  # a rotary whose forward needs more of its input: the meta device's own answer
            return forward(x, position_ids, *args, **kwargs)
        return tuple(t.to(x.device) for t in out) if isinstance(out, tuple) else out.to(x.device)

    return answered
