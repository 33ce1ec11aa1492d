"""Local TCP ports for the processes validate starts: the dry run's pods and metrics endpoints, and the library
check's single-process group, so that none of them takes a fixed port another process on the machine holds."""

from __future__ import annotations


def free_port(avoid: set[int] | None = None) -> int:
    """A TCP port nobody listens on now (bound and released), not one of ``avoid``."""
    import socket

    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if not avoid or port not in avoid:
            return port
    raise RuntimeError("no free TCP port found")
