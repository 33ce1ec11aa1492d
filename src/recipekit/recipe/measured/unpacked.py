"""transformers' packed-sequence check answered "none packed" while a pass runs without data.

A model that trains without a decoding cache has transformers look for packed sequences in its position ids
(``masking_utils.find_packed_sequence_indices``), which reads their values. The meta device and fake tensors have
none (``Tensor.item()`` fails: Bamba, HRM, Inkling), and under fake tensors transformers would otherwise build an S×S
mask. The measurements here feed unpacked batches (positions 0 to S-1 in each row), whose answer is known: None, what
the check returns for them on real tensors and what a device sees for an unpacked batch
(tests/unit/recipe/test_model_flops.py compares a count on meta with one on the CPU, where the real check runs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


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
