"""The training order: a keyed permutation of [0, rows) per epoch, computed on the fly (numpy only).

Epoch e visits every row once, in the order of a permutation keyed by (seed, e): a four-round Feistel network over
the next even power of two, walked back into [0, rows) (cycle walking keeps it a bijection). Any position of any
epoch is computed directly, in constant memory, so the order never has to be stored: a 250-million-row corpus
costs nothing more than a small one, where a shuffled index array would cost 2 GB per process.

Apart from the sampler (sampler.py) so that a reader of the row ledger (rowledger.py, the dry run's judge) can
compute the order without importing torch or transformers.
"""

from __future__ import annotations

import hashlib

import numpy as np

#: Positions mapped per numpy call while iterating.
BLOCK = 1 << 16
ROUNDS = 4
_M1, _M2, _M3 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


class Permutation:
    """A keyed bijection of [0, size), evaluated on arrays of positions."""

    def __init__(self, size: int, seed: int, epoch: int):
        self.size = size
        bits = max(2, (max(size, 1) - 1).bit_length())
        self.half = np.uint64((bits + 1) // 2)
        self.mask = np.uint64((1 << int(self.half)) - 1)
        self.keys = [
            np.uint64(int.from_bytes(hashlib.blake2b(f"{seed}:{epoch}:{r}".encode(), digest_size=8).digest(), "big"))
            for r in range(ROUNDS)
        ]

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        values = self._feistel(positions.astype(np.uint64))
        outside = values >= self.size
        while outside.any():  # cycle walking: step again until inside [0, size); at most a few times on average
            values[outside] = self._feistel(values[outside])
            outside = values >= self.size
        return values.astype(np.int64)

    def _feistel(self, values: np.ndarray) -> np.ndarray:
        left, right = values >> self.half, values & self.mask
        for key in self.keys:
            left, right = right, left ^ (_mix(right + key) & self.mask)
        return (left << self.half) | right


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every output bit depends on every input bit (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        values = values * _M1
        values ^= values >> np.uint64(30)
        values = values * _M2
        values ^= values >> np.uint64(27)
        values = values * _M3
        values ^= values >> np.uint64(31)
    return values
