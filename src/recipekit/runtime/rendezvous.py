"""The rendezvous pod's one job: serve torchrun's c10d rendezvous store until the Job is done with it.

An elastic Job (``cluster.min_nodes``) has a task of one pod for this (bundle/documents.py ``_rendezvous_task``):
every worker pod's torchrun agent meets at ``<job>-rdzv-0:<master_port>`` (``--rdzv-conf is_host=false``), so the
store outlives the loss of any worker pod, the first one included. The image's launcher starts this module with
``--serve-rendezvous`` once it has checked the run files (runtime/launch.py); it is torch's own ``TCPStore``, the
server torchrun's agents would otherwise host themselves, listening on every interface of the pod.

It serves until SIGTERM (Volcano reclaims the pod when the Job completes, or deletes it when the Job restarts) and
then exits 0. If it dies, the agents lose their store and fail, and the Job's PodFailed policy restarts the Job, as
losing the first worker pod did before.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any


def serve(port: int, stop: threading.Event) -> int:
    """Host the store on ``port`` until ``stop`` is set; 0, or 1 when the port cannot be served."""
    import torch.distributed as dist

    try:
        store = dist.TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False)
    except (RuntimeError, OSError) as exc:  # the port is taken, or no interface to listen on
        print(f"rendezvous: cannot serve port {port}: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"rendezvous: serving torchrun's c10d rendezvous store on port {port}", file=sys.stderr, flush=True)
    stop.wait()
    del store
    print("rendezvous: stopped", file=sys.stderr, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="runtime.rendezvous", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="the Job's rendezvous port (launch.json master_port)")
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port {args.port} is not a TCP port")
    stop = threading.Event()

    def finish(signum: int, frame: Any) -> None:
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, finish)
    return serve(args.port, stop)


if __name__ == "__main__":
    sys.exit(main())
