"""A script of the repository (benchmarks/, scripts/) imported by path for a test, and forgotten afterwards."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType


@contextmanager
def script_module(path: Path) -> Iterator[ModuleType]:
    """The module ``path`` holds, registered under its stem while the ``with`` block runs (dataclasses look their
    module up while a class is made)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
