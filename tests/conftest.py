"""Shared test helper: render a recipe's bundle in memory, the way `recipekit build` does."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import pytest

from recipekit import memory
from recipekit.bundle.build import Resolved, compile_bundle, resolve
from recipekit.bundle.documents import Documents, make_documents
from recipekit.memory.operations import operations

# Two test workers share two cores (pyproject's addopts): one compute thread each. torch would start a thread a core
# in every worker and in every process a test starts, and those fight over the cores (the dry run's pods already run
# one each: validate/dryrun/cluster/attempts.py). Set before any test imports torch (recipekit's
# build path, imported above, never does).
for _threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")


@pytest.fixture(autouse=True)
def _no_team_layers_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A developer's own $RECIPEKIT_RECIPES must not leak into the CLI tests (team layers are tested explicitly)."""
    monkeypatch.delenv("RECIPEKIT_RECIPES", raising=False)
    yield


def render_files(overrides: Sequence[str], *, allow_oom: bool = False) -> dict[str, bytes]:
    """The files `recipekit build` would write for ``overrides``, in memory."""
    return compile_bundle(resolve(overrides), allow_oom=allow_oom).files


def documents_of(resolved: Resolved) -> Documents:
    """The bundle documents `recipekit build` would render for ``resolved`` (after the estimate and operations)."""
    recipe, plan = resolved.recipe, resolved.plan
    return make_documents(recipe, plan, operations(recipe, plan, memory.estimate(recipe, plan)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files that hold the longest tests run first, then the other files with slow tests, each file's tests in
    their order.

    xdist hands whole files to its two workers in collection order (``--dist loadfile``); a dry-run file or the model
    sweep handed out last would leave one worker running it alone for minutes, while the many quick files at the end
    of the order let the two finish together. Collection order alone put the model sweep (tests/unit) behind every
    integration file: hence the ``longest`` mark. xdist keeps this order only with ``--no-loadscope-reorder``
    (pyproject's ``addopts``): by default it hands out the files with the most tests first."""
    longest = {item.path for item in items if item.get_closest_marker("longest")}
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (item.path not in longest, item.path not in slow))
