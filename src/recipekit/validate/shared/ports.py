"""Local TCP ports for the processes validate starts: the dry run's pods and metrics endpoints, and the library
check's single-process group, so that none of them takes a fixed port another process on the machine holds.

A port is chosen seconds before its process binds it (torchrun's store, a pod's exporter after its imports), so
"free now" must stay true until then. The kernel's ephemeral range is where every outgoing connection's local port
comes from, and a busy machine opens many (the gloo ranks of another dry run): a port taken from that range, as
``bind(0)`` hands out, was seen taken by the time torchrun listened (EADDRINUSE in the full suite). So the ports
come from below that range, at random, where only another explicit choice like this one can land.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: Where the kernel reads its ephemeral range; Linux's default when it cannot be read.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)
#: The lowest port chosen: above the well-known and most registered services' ports.
LOWEST = 20000
_TRIES = 200


def ephemeral_range(source: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (low, high)."""
    try:
        low, high = (int(word) for word in source.read_text(encoding="ascii").split()[:2])
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return (low, high) if 0 < low <= high <= 65535 else DEFAULT_EPHEMERAL


def candidate_ports(ephemeral: tuple[int, int]) -> range:
    """The ports to choose from: below the ephemeral range where it leaves room, else above it; the whole
    unprivileged range when the kernel leaves neither (then this is no better than ``bind(0)``)."""
    low, high = ephemeral
    if low - LOWEST >= 1000:
        return range(LOWEST, low)
    if 65535 - high >= 1000:
        return range(high + 1, 65536)
    return range(1024, 65536)


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(avoid: set[int] | None = None, span: int = 1) -> int:
    """A port nobody listens on now, outside the ephemeral range, with the ``span - 1`` ports after it free too (a
    pod's local ranks listen on consecutive ports), none of them in ``avoid``."""
    avoid = avoid or set()
    choices = candidate_ports(ephemeral_range())
    for _ in range(_TRIES):
        port = random.choice(choices[: len(choices) - span + 1])  # noqa: S311 - spreading choices, not a secret
        ports = range(port, port + span)
        if not avoid.intersection(ports) and all(_free(p) for p in ports):
            return port
    raise RuntimeError(f"no {span} free TCP port(s) found in {choices.start}-{choices.stop - 1}")
