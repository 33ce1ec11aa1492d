"""The dry run's ports come from outside the kernel's ephemeral range, where outgoing connections take theirs: the
full suite once saw torchrun's store fail with EADDRINUSE on a port `bind(0)` had handed out seconds before."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from recipekit.validate.shared import ports


def test_the_ephemeral_range_is_read_from_the_kernel_and_a_broken_file_falls_back(tmp_path: Path) -> None:
    source = tmp_path / "ip_local_port_range"
    source.write_text("40000\t50000\n")
    assert ports.ephemeral_range(source) == (40000, 50000)
    for broken in ("", "x y", "50000 40000", "0 70000"):
        source.write_text(broken)
        assert ports.ephemeral_range(source) == ports.DEFAULT_EPHEMERAL
    assert ports.ephemeral_range(tmp_path / "absent") == ports.DEFAULT_EPHEMERAL


@pytest.mark.parametrize(
    ("ephemeral", "expected"),
    [((32768, 60999), range(20000, 32768)), ((20500, 60000), range(60001, 65536)), ((1024, 65000), range(1024, 65536))],
)
def test_candidates_lie_below_the_ephemeral_range_else_above_it(ephemeral, expected) -> None:
    assert ports.candidate_ports(ephemeral) == expected


def test_a_chosen_span_is_outside_the_ephemeral_range_free_and_clear_of_avoid() -> None:
    low, high = ports.ephemeral_range()
    avoid: set[int] = set()
    for _ in range(20):
        first = ports.free_port(avoid, span=3)
        span = range(first, first + 3)
        assert not avoid.intersection(span)
        assert all(not low <= p <= high for p in span)
        avoid.update(span)


def test_a_port_someone_listens_on_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        held.listen()
        monkeypatch.setattr(ports, "candidate_ports", lambda ephemeral: range(taken - 1, taken + 1))
        assert ports.free_port(span=1) == taken - 1  # the only other candidate
        with pytest.raises(RuntimeError, match="no 2 free TCP port"):
            ports.free_port(span=2)  # both spans that fit hold the taken port
