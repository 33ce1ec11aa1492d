"""What the data-path tests share: the random twin's tokenizer and the prepare settings they start from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from recipekit.validate.dryrun.workdir.tinydata import tiny_records

#: Sequence length of the data-path tests: short enough for quick tokenising, long enough to pack several samples.
MAX_LEN = 96


@pytest.fixture(scope="session")
def data_tokenizer() -> Any:
    """The random twin's tokenizer, trained on tiny chat and text data as a run would."""
    pytest.importorskip("tokenizers")
    from recipekit.runtime.model import twin

    texts = [m["content"] for r in tiny_records("messages", 200) for m in r["messages"]]
    texts += [r["text"] for r in tiny_records("text", 100)]
    return twin.train_tokenizer(texts, vocab_size=512, max_length=512)


def prepare_settings(fmt: str = "alpaca", **changes: Any) -> Any:
    """Prepare settings for ``fmt`` with small chunks (several per tiny file), changed by ``changes``."""
    from recipekit.runtime.data.fingerprint import Settings

    base = {
        "format": fmt,
        "max_len": MAX_LEN,
        "packing": False,
        "eval_fraction": 0.0,
        "seed": 7,
        "chunk_bytes": 4096,
        "max_bad_records": 0,
        "check": "stat",
    }
    return Settings(**{**base, **changes})


def with_bad_lines(path: Path, lines: dict[int, str]) -> Path:
    """``path`` (a JSON lines file) with the lines numbered in ``lines`` (from 1) replaced by their text."""
    text = path.read_text().splitlines()
    for number, line in lines.items():
        text[number - 1] = line
    path.write_text("\n".join(text) + "\n")
    return path
