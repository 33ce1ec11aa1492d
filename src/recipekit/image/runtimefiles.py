"""Which of the runtime package's files an engine's bundles ship and its image holds.

The runtime (``src/recipekit/runtime``) is one package: the launcher, the boundary both sides share, the operations
layer, the volume's readers and writers, and the Trainer's entrypoint with its session, model and data modules.
An engine other than the Trainer adds a room of its own (``runtime/<room>/``), which ships only in that engine's
bundles and image: a Trainer bundle, and the image it names, stay what they were before the room existed.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from recipekit.base.paths import RUNTIME_DIR

#: What of the runtime belongs to one engine, by engine: its room (``<room>/``, every module below it) and the
#: boundary module both sides read its document with. They ship with that engine only.
ENGINE_PARTS = {"megatron": ("megatron/", "boundary/megatronview.py")}


@cache
def runtime_sources(engine: str) -> dict[str, Path]:
    """Path inside the runtime package (``train.py``, ``boundary/filenames.py``) → source file, for ``engine``'s
    bundles: every module but other engines' rooms, in a stable order."""
    foreign = tuple(part for other, parts in ENGINE_PARTS.items() if other != engine for part in parts)
    sources = {}
    for path in sorted(RUNTIME_DIR.rglob("*.py"), key=lambda p: p.relative_to(RUNTIME_DIR).as_posix()):
        relative = path.relative_to(RUNTIME_DIR)
        name = relative.as_posix()
        if "__pycache__" not in relative.parts and not name.startswith(foreign):
            sources[name] = path
    return sources
