"""The cluster commands run in-process (click's runner, 80 columns) against a RecordedAPIServer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from recipekit.cli import main
from tests.unit.cluster.apiserver import RecordedAPIServer


@pytest.fixture
def server() -> Iterator[RecordedAPIServer]:
    with RecordedAPIServer() as running:
        yield running


def invoke(*args: str) -> Result:
    return CliRunner(env={"COLUMNS": "80"}).invoke(main, list(args))


def fits(result: Result, width: int = 80) -> bool:
    """Every line the command printed (stdout and stderr) fits ``width`` columns."""
    return all(len(line) <= width for line in (result.stdout + result.stderr).splitlines())


def command(server: RecordedAPIServer, tmp_path: Path, *args: str) -> Result:
    """``recipekit ARGS --kubeconfig <the server's>``."""
    return invoke(*args, "--kubeconfig", str(server.kubeconfig(tmp_path)))
