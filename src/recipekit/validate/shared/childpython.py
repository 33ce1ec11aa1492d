"""Python child processes that import only the bundle and the installed libraries, never the current directory.

``python -m module`` and ``python -c code`` put the current directory first on ``sys.path``, so a ``runtime/``
package or a ``yaml.py`` in whatever directory recipekit was started from would be imported instead of the bundle's
or the library's. Every Python child recipekit starts goes through :func:`python_argv` and :func:`safe_env`:
``-P`` (Python 3.11+: no unsafe path entry) plus ``PYTHONSAFEPATH=1`` for the child's own children, and on older
Pythons a bootstrap that drops the entry before running the module or the code.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

#: The variable that keeps the current directory off sys.path in every Python started below the child (3.11+).
SAFE_PATH_ENV = "PYTHONSAFEPATH"
_DROP_CWD = "import sys; sys.path[:1] = [] if sys.path[:1] in ([''], ['.']) else sys.path[:1]"
_RUN_MODULE = (
    _DROP_CWD + "; import runpy; del sys.argv[0]; runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


def python_argv(*args: str, python: str | os.PathLike[str] = sys.executable) -> list[str]:
    """This interpreter (or ``python``, a venv of this same Python) with ``args`` (``"-m", module, ...`` or ``"-c",
    code, ...``), the cwd off its path."""
    interpreter = os.fspath(python)
    if sys.version_info >= (3, 11):
        return [interpreter, "-P", *args]
    if args[:1] == ("-m",):  # pragma: no cover - Python 3.10 only
        return [interpreter, "-c", _RUN_MODULE, *args[1:]]
    if args[:1] == ("-c",):  # pragma: no cover - Python 3.10 only
        return [interpreter, "-c", _DROP_CWD + "\n" + args[1], *args[2:]]
    raise ValueError(f"python_argv takes -m MODULE or -c CODE, not {args[:1]}")  # pragma: no cover


def safe_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with :data:`SAFE_PATH_ENV` set, for the child's own Python children."""
    return {**(os.environ if env is None else env), SAFE_PATH_ENV: "1"}
