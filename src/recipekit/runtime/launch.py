"""The pod's launcher: Volcano's injected variables + launch.json → one ``torchrun`` for this pod.

run.sh prepares the process environment (CANN's set_env.sh on Ascend) and execs ``python3 -m runtime.launch
launch.json``. Everything recipe-specific is data in launch.json, read here, so no recipe value is ever parsed by a
shell. Standard library only: it runs before anything else in the image is trusted.

What it checks, each failure a one-line reason and a non-zero exit so Volcano's policy acts:

* the run files beside launch.json (the ConfigMap mounted read-only) are the ones whose digest the Job carries
  (exit 2: an edited ConfigMap will not heal by restarting; :mod:`.boundary.runfiles`);
* the env plugin's ``VC_TASK_INDEX`` and the svc plugin's ``VC_<TASK>_HOSTS`` / ``VC_<TASK>_NUM`` (or its
  ``/etc/volcano/<task>.host`` file) are there, and the pod count is the one the bundle was built for (exit 2: a
  Job edited by hand or a missing plugin will not heal by restarting);
* the first pod's DNS name resolves within ``master_dns_wait_s`` (the svc plugin's records lag the pods by seconds;
  past that, exit 1: a restart may land on healthier nodes).

Then it exports launch.json's ``env`` (a value already set in the pod spec wins), MASTER_ADDR and MASTER_PORT, and
runs torchrun as its child. The pod's exit status is the run's own code (``exitcodes.EXIT_CODES``), because the Job's
exitCode policies act on it: torchrun exits 1 whatever its worker's code, so each worker writes its code into a
directory the launcher names (``exitcodes.EXIT_DIR_ENV``) and the launcher exits with the first failure's. SIGTERM
and SIGINT are passed on to torchrun (which passes them to train.py, which saves a checkpoint); once torchrun has
ended, the launcher ends by the same signal, so a signal stays a signal.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .boundary import (
    exitcodes,
    filenames,
    runfiles,
)  # the package is ``runtime`` in a bundle, ``recipekit.runtime`` in recipekit
from .volume import recovery

#: Where the svc plugin also writes each task's hosts, one per line.
VOLCANO_HOSTS_DIR = Path("/etc/volcano")
#: Seconds between DNS attempts while waiting for the master's record.
DNS_RETRY_S = 2.0


class LaunchError(Exception):
    """A reason not to start torchrun, with the exit code it deserves."""

    def __init__(self, message: str, code: int = exitcodes.EXIT_USER_ERROR):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Topology:
    """This pod's place in the Job, from what Volcano injected."""

    node_rank: int
    nodes: int
    hosts: list[str]

    @property
    def master(self) -> str:
        return self.hosts[0]


def read_spec(path: Path) -> dict[str, Any]:
    """launch.json, with the keys this launcher needs."""
    try:
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LaunchError(f"cannot read {path}: {exc}") from None
    required = ("task_name", "task_env", "nodes", "nproc_per_node", "master_port", "env", "module", "args")
    missing = [key for key in required if key not in spec] if isinstance(spec, dict) else list(required)
    if missing:
        raise LaunchError(f"{path} lacks {', '.join(missing)}: rebuild the bundle with `recipekit build`")
    return spec


def topology(spec: Mapping[str, Any], environ: Mapping[str, str], hosts_dir: Path = VOLCANO_HOSTS_DIR) -> Topology:
    """Volcano's variables for this pod, checked against the bundle's plan."""
    task, task_env = spec["task_name"], spec["task_env"]
    index = environ.get("VC_TASK_INDEX", environ.get("VK_TASK_INDEX"))
    if index is None:
        raise LaunchError("VC_TASK_INDEX is not set: the Volcano Job needs the env plugin (spec.plugins.env)")
    hosts_var, num_var = f"VC_{task_env}_HOSTS", f"VC_{task_env}_NUM"
    hosts_text = environ.get(hosts_var)
    if hosts_text is None:
        hosts_file = hosts_dir / f"{task_env.lower()}.host"
        try:
            hosts_text = ",".join(hosts_file.read_text(encoding="utf-8").split())
        except OSError:
            raise LaunchError(
                f"{hosts_var} is not set and {hosts_file} is missing: the Volcano Job needs the svc plugin "
                f"(spec.plugins.svc) and a task named {task!r}"
            ) from None
    hosts = [h for h in hosts_text.split(",") if h]
    nodes_text = environ.get(num_var, str(len(hosts)))
    if not (index.isdigit() and nodes_text.isdigit()):
        raise LaunchError(f"VC_TASK_INDEX={index!r}, {num_var}={nodes_text!r}: expected non-negative integers")
    node_rank, nodes = int(index), int(nodes_text)
    if nodes != spec["nodes"]:
        raise LaunchError(
            f"the Job has {nodes} pods but this bundle was built for {spec['nodes']}: "
            f"rebuild with cluster.nodes={nodes}"
        )
    if len(hosts) != nodes or node_rank >= nodes:
        raise LaunchError(f"{hosts_var} lists {len(hosts)} hosts, {num_var}={nodes}, VC_TASK_INDEX={node_rank}")
    return Topology(node_rank, nodes, hosts)


def wait_for_master(
    host: str,
    timeout_s: float,
    resolve: Callable[[str], Any] = socket.gethostbyname,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Until the master's name resolves; past ``timeout_s`` a LaunchError (exit 1) instead of a doomed torchrun."""
    deadline = clock() + timeout_s
    while True:
        try:
            resolve(host)
            return
        except OSError as exc:
            if clock() >= deadline:
                raise LaunchError(
                    f"the master {host} did not resolve within {timeout_s:g} s ({exc}): check the svc plugin's "
                    "headless Service and the cluster DNS",
                    code=exitcodes.EXIT_FAILED,
                ) from None
        sleep(DNS_RETRY_S)


def check_run_files(directory: Path, environ: Mapping[str, str]) -> None:
    """The mounted run files are the ones the Job was rendered with (``runfiles.DIGEST_ENV``), before any of them is
    read: a LaunchError (exit 2) otherwise, since restarting cannot heal an edited ConfigMap."""
    reason = runfiles.mismatch(directory, environ.get(runfiles.DIGEST_ENV))
    if reason is not None:
        raise LaunchError(reason)


def torchrun_argv(spec: Mapping[str, Any], topo: Topology, bundle_dir: Path) -> list[str]:
    """One torchrun per pod: static rendezvous on the first pod, ``nproc_per_node`` workers here."""
    return [
        "torchrun",
        f"--nnodes={topo.nodes}",
        f"--node_rank={topo.node_rank}",
        f"--nproc_per_node={spec['nproc_per_node']}",
        f"--master_addr={topo.master}",
        f"--master_port={spec['master_port']}",
        "-m",
        str(spec["module"]),
        "--recipe",
        str(bundle_dir / filenames.RECIPE_FILE),
        *[str(a) for a in spec["args"]],
    ]


def environment(spec: Mapping[str, Any], topo: Topology, environ: Mapping[str, str]) -> dict[str, str]:
    """The process environment torchrun starts with: the pod's, plus launch.json's defaults and the rendezvous."""
    env = dict(environ)
    for key, value in spec["env"].items():
        env.setdefault(str(key), str(value))
    env["MASTER_ADDR"], env["MASTER_PORT"] = topo.master, str(spec["master_port"])
    return env


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0] if args else filenames.LAUNCH_FILE).resolve()
    try:
        check_run_files(path.parent, os.environ)
        spec = read_spec(path)
        topo = topology(spec, os.environ)
        wait_for_master(topo.master, float(spec.get("master_dns_wait_s", 120)))
    except LaunchError as exc:
        print(f"launch: {exc}", file=sys.stderr)
        return exc.code
    argv_out = torchrun_argv(spec, topo, path.parent)
    print(
        f"launch: pod {topo.node_rank}/{topo.nodes} of {spec.get('job_name', '?')}; master "
        f"{topo.master}:{spec['master_port']}; {spec['nproc_per_node']} processes per pod",
        file=sys.stderr,
        flush=True,
    )
    env = environment(spec, topo, os.environ)
    exit_dir = tempfile.mkdtemp(prefix="recipekit-exit-")
    env[exitcodes.EXIT_DIR_ENV] = exit_dir
    env.setdefault(recovery.LAUNCH_TIME_ENV, str(time.time()))  # when this attempt of the pod began (MTTR)
    try:
        return supervise(argv_out, env, Path(exit_dir))
    finally:
        shutil.rmtree(exit_dir, ignore_errors=True)


#: The signals passed on to torchrun: the kubelet's SIGTERM, a terminal's Ctrl-C, a closed session.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def supervise(argv: list[str], env: dict[str, str], exit_dir: Path) -> int:
    """Run torchrun as a child, pass signals on, and return the pod's exit code (see :func:`pod_exit_code`).

    When a signal ended the launcher's wait, the launcher ends by that signal itself (``raise_signal``), so the
    container's status says the pod was signalled; as PID 1 of a container the kernel ignores a signal without a
    handler, so the code 128 + N it would have had is returned instead.
    """
    received: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        received.append(signum)
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    child: subprocess.Popen[bytes] | None = None
    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    try:
        child = subprocess.Popen(argv, env=env)
        if received:  # a signal that came before the child existed
            child.send_signal(received[0])
        code = child.wait()
    except OSError as exc:
        print(f"launch: cannot start {argv[0]}: {exc}", file=sys.stderr)
        return exitcodes.EXIT_FAILED
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    result = pod_exit_code(code, exitcodes.worker_exit_code(exit_dir), received[0] if received else None)
    name = exitcodes.exit_code_name(result)
    print(f"launch: torchrun exited {code}; the pod exits {name} ({result})", file=sys.stderr)
    sys.stderr.flush()
    if received:
        shutil.rmtree(exit_dir, ignore_errors=True)  # the caller's cleanup would not run after the signal
        signal.signal(received[0], signal.SIG_DFL)
        signal.raise_signal(received[0])  # ends the process unless it is a container's PID 1
    return result


def pod_exit_code(torchrun_code: int, worker_code: int | None, signum: int | None) -> int:
    """The pod's exit code: 128 + N when signal N stopped the pod; else the first failed worker's code; else
    torchrun's own (0, or its failure before any worker ran). A negative ``torchrun_code`` (torchrun itself killed by
    signal N, as subprocess reports it) becomes 128 + N."""
    if signum is not None:
        return 128 + signum
    if torchrun_code == 0:
        return exitcodes.EXIT_OK
    if worker_code is not None:
        return worker_code
    return 128 - torchrun_code if torchrun_code < 0 else torchrun_code


if __name__ == "__main__":
    sys.exit(main())
