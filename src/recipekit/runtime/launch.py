"""The pod's launcher and the container's command: Volcano's injected variables + launch.json → one ``torchrun``.

The Job starts ``python3 -m runtime.launch /workspace/run/launch.json`` from the image's working directory: this
module is the image's own code, and it is the first thing of the run to execute. Everything recipe-specific is data
in the run files (the ConfigMap mounted at ``/workspace/run``), which are untrusted until checked: the launcher reads
them once, compares them with the digest the Job's spec carries (:mod:`.boundary.runfiles`; a ConfigMap editor cannot
change the Job), copies the checked bytes into a directory of its own, and from then on nothing reads the mount
again. No recipe value is ever parsed by a shell. Standard library only: it runs before anything else is trusted.

What it checks, each failure a one-line reason and a non-zero exit so Volcano's policy acts:

* the run files are the ones whose digest the Job carries, and the Job carries one (exit 2: an edited ConfigMap
  will not heal by restarting). ``--by-hand`` (what a bundle's run.sh passes, outside any Job) lets a missing digest
  pass: the person running a bundle directory owns its files;
* the environment set-up the image needs: CANN's ``set_env.sh`` scripts (launch.json ``cann_env``) sourced in a
  shell whose exported variables torchrun inherits, a missing or failing one refused with the reason (exit 2), and
  the runtime package's directory put first on ``PYTHONPATH``;
* the env plugin's ``VC_TASK_INDEX`` and the svc plugin's ``VC_<TASK>_HOSTS`` / ``VC_<TASK>_NUM`` (or its
  ``/etc/volcano/<task>.host`` file) are there, and the pod count is the one the bundle was built for (exit 2: a
  Job edited by hand or a missing plugin will not heal by restarting);
* the first pod's DNS name (an elastic Job's: the rendezvous pod's) resolves within ``master_dns_wait_s`` (the
  svc plugin's records lag the pods by seconds; past that, exit 1: a restart may land on healthier nodes).

Then it exports launch.json's ``env`` (a value already set in the pod spec wins), MASTER_ADDR and MASTER_PORT, and
runs torchrun as its child: a static rendezvous on the first pod, or for an elastic run (launch.json ``elastic``,
``cluster.min_nodes``) torchrun's own elastic agent, which goes on without a lost pod and takes it back when its
replacement starts (:func:`elastic_options`). An elastic Job's rendezvous pod runs this launcher with
``--serve-rendezvous``: the same checks, then torchrun's rendezvous store instead of torchrun
(:func:`serve_rendezvous`).

The pod's exit status is the run's own code (``exitcodes.EXIT_CODES``), because the Job's exitCode policies act on
it: torchrun exits 1 whatever its worker's code, so each worker writes its code into a directory the launcher names
(``exitcodes.EXIT_DIR_ENV``) and the launcher exits with the first failure's. SIGTERM and SIGINT are passed on to
torchrun (which passes them to train.py, which saves a checkpoint); once torchrun has ended, the launcher ends by the
same signal, so a signal stays a signal.
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
    #: the rendezvous pod's host (an elastic Job's rendezvous task, launch.json ``elastic.rendezvous``), or None
    rendezvous: str | None = None

    @property
    def master(self) -> str:
        return self.hosts[0]

    @property
    def meeting_point(self) -> str:
        """Where the agents meet: the rendezvous pod, else the first pod."""
        return self.rendezvous or self.master


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
    hosts = task_hosts(task, task_env, environ, hosts_dir)
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
    return Topology(node_rank, nodes, hosts, rendezvous_host(spec, environ, hosts_dir))


def task_hosts(task: str, task_env: str, environ: Mapping[str, str], hosts_dir: Path = VOLCANO_HOSTS_DIR) -> list[str]:
    """The hosts of the Job's task ``task``: the svc plugin's ``VC_<TASK>_HOSTS``, or its file under /etc/volcano."""
    hosts_var = f"VC_{task_env}_HOSTS"
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
    return [h for h in hosts_text.split(",") if h]


def rendezvous_host(
    spec: Mapping[str, Any], environ: Mapping[str, str], hosts_dir: Path = VOLCANO_HOSTS_DIR
) -> str | None:
    """The rendezvous pod's host when launch.json names an elastic Job's rendezvous task (runtime/rendezvous.py),
    else None; a LaunchError (exit 2) when the task is named but the Job has not exactly one pod of it."""
    elastic = spec.get("elastic")
    named = elastic.get("rendezvous") if isinstance(elastic, dict) else None
    if named is None:
        return None
    if not (isinstance(named, dict) and all(isinstance(named.get(k), str) for k in ("task_name", "task_env"))):
        raise LaunchError("launch.json's elastic.rendezvous is not a task_name and task_env: rebuild the bundle")
    hosts = task_hosts(named["task_name"], named["task_env"], environ, hosts_dir)
    if len(hosts) != 1:
        raise LaunchError(f"the Job's {named['task_name']!r} task has {len(hosts)} pods, not the one rendezvous pod")
    return hosts[0]


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


def checked_run_files(launch_file: Path, environ: Mapping[str, str], into: Path, by_hand: bool = False) -> Path:
    """The run files beside ``launch_file``, checked against the Job's digest (``runfiles.DIGEST_ENV``) before any of
    them is read, copied into ``into`` (a directory of this pod's own); returns that copy's launch.json. A
    LaunchError (exit 2) when they differ or the Job carries no digest (``by_hand`` lets a missing one pass: a bundle
    directory started by its run.sh, outside any Job); restarting cannot heal either."""
    directory = launch_file.parent
    try:
        if by_hand and not environ.get(runfiles.DIGEST_ENV):
            files = runfiles.read_mounted(directory)
        else:
            files = runfiles.verified(directory, environ.get(runfiles.DIGEST_ENV))
    except runfiles.RunFilesRefused as exc:
        raise LaunchError(str(exc)) from None
    except OSError as exc:
        raise LaunchError(f"cannot read the run files in {directory}: {exc.strerror or exc}") from None
    into.mkdir(mode=0o700)
    for name, data in files.items():
        (into / name).write_bytes(data)
    return into / filenames.LAUNCH_FILE


#: Sources each existing script given as an argument (errexit and nounset off: CANN's scripts read unset variables
#: and may return non-zero), then prints the environment NUL-separated after a marker. A failing script prints
#: ``failed``, its path and its status instead; none found prints ``none``. The scripts' own output goes to stderr.
_SOURCE = r"""
set +eu
__recipekit_found=0
for __recipekit_script in "$@"; do
  if [ -f "$__recipekit_script" ]; then
    . "$__recipekit_script" >&2
    __recipekit_status=$?
    if [ "$__recipekit_status" -ne 0 ]; then
      printf 'failed\0%s\0%s\0' "$__recipekit_script" "$__recipekit_status"
      exit 0
    fi
    __recipekit_found=1
  fi
done
if [ "$__recipekit_found" -eq 0 ]; then printf 'none\0'; exit 0; fi
printf 'env\0'
exec env -0
"""


def sourced_environment(scripts: list[str], environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` after sourcing ``scripts`` (CANN's set_env.sh: it must be sourced by the process tree that
    trains, and a Dockerfile ``RUN source`` is gone by the time the pod starts); unchanged when there are none. A
    LaunchError (exit 2) when none of them exists or one fails: the image's CANN installation is missing or broken."""
    if not scripts:
        return dict(environ)
    try:
        proc = subprocess.run(
            ["bash", "-c", _SOURCE, "bash", *scripts], env=dict(environ), stdout=subprocess.PIPE, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"cannot source CANN's environment ({', '.join(scripts)}): {exc}") from None
    fields = proc.stdout.split(b"\0")
    kind = fields[0].decode(errors="replace")
    if kind == "none":
        raise LaunchError(f"no CANN environment script found ({', '.join(scripts)}): this image has no CANN toolkit")
    if kind == "failed" and len(fields) >= 3:
        script, status = (f.decode(errors="replace") for f in fields[1:3])
        raise LaunchError(f"{script} failed with exit {status}: the CANN installation in the image is broken")
    if kind != "env" or proc.returncode != 0:
        raise LaunchError(
            f"sourcing CANN's environment ({', '.join(scripts)}) ended the shell (exit {proc.returncode}): "
            "the CANN installation in the image is broken"
        )
    env = {}
    for entry in fields[1:]:
        key, sep, value = entry.decode("utf-8", errors="surrogateescape").partition("=")
        if sep and key and key not in ("_", "SHLVL", "PWD", "OLDPWD"):
            env[key] = value
    return env


def runtime_root() -> Path:
    """The directory holding this runtime package (the image's working directory; a bundle directory by hand)."""
    return Path(__file__).absolute().parent.parent


def prepared_environment(spec: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, str]:
    """What run.sh prepared before: the image's CANN environment sourced, the runtime package first on
    PYTHONPATH (after CANN's own entries are in: torchrun's workers import ``runtime.train``)."""
    scripts = spec.get("cann_env") or []
    if not isinstance(scripts, list) or not all(isinstance(s, str) for s in scripts):
        raise LaunchError("launch.json's cann_env is not a list of paths: rebuild the bundle with `recipekit build`")
    env = sourced_environment(scripts, environ)
    python_path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(runtime_root()) + (f":{python_path}" if python_path else "")
    return env


def torchrun_argv(spec: Mapping[str, Any], topo: Topology, bundle_dir: Path) -> list[str]:
    """One torchrun per pod, ``nproc_per_node`` workers here: a static rendezvous on the first pod, or for an
    elastic run (launch.json ``elastic``) torchrun's own elastic agent (:func:`elastic_options`)."""
    elastic, nproc = spec.get("elastic"), f"--nproc_per_node={spec['nproc_per_node']}"
    rendezvous = (
        [*elastic_options(spec, topo, elastic), nproc]
        if isinstance(elastic, dict)
        else [
            f"--nnodes={topo.nodes}",
            f"--node_rank={topo.node_rank}",
            nproc,
            f"--master_addr={topo.master}",
            f"--master_port={spec['master_port']}",
        ]
    )
    return [
        "torchrun",
        *rendezvous,
        "-m",
        str(spec["module"]),
        "--recipe",
        str(bundle_dir / filenames.RECIPE_FILE),
        *[str(a) for a in spec["args"]],
    ]


def elastic_options(spec: Mapping[str, Any], topo: Topology, elastic: Mapping[str, Any]) -> list[str]:
    """torchrun's elastic agent: ``--nnodes MIN:MAX`` over its c10d rendezvous at the rendezvous pod's fixed port.

    When a pod is lost, the agents that are left restart their workers on the pods that answer (at least MIN,
    after torchrun's last-call wait); when its replacement is scheduled, its agent joins and every agent restarts
    its workers at the larger size. The rendezvous pod (the Job's rendezvous task, runtime/rendezvous.py) hosts the
    store, so no worker pod's loss takes it along; every agent is a client of it (``is_host=false``, not torchrun's
    guess from host names, which every pod of a one-host dry run would match). A bundle built before that task
    existed names none, and its first pod's agent hosts the store. Each agent names itself by its own entry in
    Volcano's host list (``--local-addr``), which the other pods resolve: the rendezvous ranks the agents by it
    (then by pid), so rank 0 is on the pod whose name sorts first. A worker failure costs one of
    ``max_restarts``; a change of size costs none. The last-call wait (``last_call_s``, cluster.elastic_wait_s)
    is how long a round that has MIN waits for more."""
    low, restarts, wait = (elastic.get(key) for key in ("min_nodes", "max_restarts", "last_call_s"))
    hosts_store = topo.rendezvous is None and topo.node_rank == 0  # no rendezvous pod: the first pod's agent
    whole = all(isinstance(v, int) and not isinstance(v, bool) for v in (low, restarts, wait))
    if not (
        whole and 1 <= int(low or 0) <= topo.nodes and 0 <= int(restarts or 0) <= 1000 and 0 < int(wait or 0) <= 3600
    ):
        raise LaunchError(
            f"launch.json's elastic is not a min_nodes, max_restarts and last_call_s of this Job: {dict(elastic)}"
        )
    return [
        f"--nnodes={low}:{topo.nodes}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={topo.meeting_point}:{spec['master_port']}",
        f"--rdzv-id={spec.get('run_id') or spec.get('job_name') or 'recipekit'}",
        f"--rdzv-conf=is_host={'true' if hosts_store else 'false'},last_call_timeout={wait}",
        f"--max-restarts={restarts}",
        f"--local-addr={topo.hosts[topo.node_rank]}",
    ]


#: torch 2.13's agents hang when a node joins a running elastic job while the workers share the agents' rendezvous
#: store (the round's rank 0 waits for every agent's role, the newcomer for the store's address: both time out after
#: 60 s); with a store of their own, shrinking and growing both work (measured, 2 × 1 process on this machine).
ELASTIC_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def environment(spec: Mapping[str, Any], topo: Topology, environ: Mapping[str, str]) -> dict[str, str]:
    """The process environment torchrun starts with: the pod's, plus launch.json's defaults and the rendezvous."""
    env = dict(environ)
    for key, value in spec["env"].items():
        env.setdefault(str(key), str(value))
    env["MASTER_ADDR"], env["MASTER_PORT"] = topo.master, str(spec["master_port"])
    if isinstance(spec.get("elastic"), dict):
        env.update(ELASTIC_ENV)
    return env


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    by_hand, serve = "--by-hand" in args, filenames.SERVE_RENDEZVOUS in args
    args = [a for a in args if a not in ("--by-hand", filenames.SERVE_RENDEZVOUS)]
    path = Path(args[0] if args else filenames.LAUNCH_FILE).absolute()
    private = Path(tempfile.mkdtemp(prefix="recipekit-pod-"))  # this pod's own: the checked files, the exit codes
    try:
        try:
            checked = checked_run_files(path, os.environ, private / filenames.RUN_FILES_DIR, by_hand)
            spec = read_spec(checked)
            pod_env = prepared_environment(spec, os.environ)
            if serve:
                return serve_rendezvous(spec, pod_env, private)
            topo = topology(spec, pod_env)
            argv_out = torchrun_argv(spec, topo, checked.parent)  # an elastic range that is not the Job's: exit 2
            wait_for_master(topo.meeting_point, float(spec.get("master_dns_wait_s", 120)))
        except LaunchError as exc:
            print(f"launch: {exc}", file=sys.stderr)
            return exc.code
        meeting = "rendezvous pod" if topo.rendezvous else "master"
        print(
            f"launch: pod {topo.node_rank}/{topo.nodes} of {spec.get('job_name', '?')}; {meeting} "
            f"{topo.meeting_point}:{spec['master_port']}; {spec['nproc_per_node']} processes per pod",
            file=sys.stderr,
            flush=True,
        )
        env = environment(spec, topo, pod_env)
        exit_dir = private / "exit"
        exit_dir.mkdir()
        env[exitcodes.EXIT_DIR_ENV] = str(exit_dir)
        env.setdefault(recovery.LAUNCH_TIME_ENV, str(time.time()))  # when this attempt of the pod began (MTTR)
        return supervise(argv_out, env, exit_dir, scratch=private)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def serve_rendezvous(spec: Mapping[str, Any], pod_env: dict[str, str], private: Path) -> int:
    """The rendezvous pod: once the run files are checked, torch's TCPStore on the Job's rendezvous port
    (runtime/rendezvous.py) as this launcher's child, until the Job is done with it. A LaunchError (exit 2) when
    launch.json names no rendezvous task: a Job edited to start it elsewhere."""
    elastic = spec.get("elastic")
    if not (isinstance(elastic, dict) and elastic.get("rendezvous")):
        raise LaunchError(
            f"{filenames.SERVE_RENDEZVOUS}: launch.json names no rendezvous task (the run is not elastic)"
        )
    port = spec["master_port"]
    print(f"launch: the rendezvous pod of {spec.get('job_name', '?')}; port {port}", file=sys.stderr, flush=True)
    exit_dir = private / "exit"
    exit_dir.mkdir()
    module = f"{__package__}.rendezvous"  # ``runtime.rendezvous`` in the image
    argv = [sys.executable, "-m", module, "--port", str(port)]
    return supervise(argv, pod_env, exit_dir, scratch=private, name="the rendezvous store")


#: The signals passed on to torchrun: the kubelet's SIGTERM, a terminal's Ctrl-C, a closed session.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def supervise(
    argv: list[str], env: dict[str, str], exit_dir: Path, scratch: Path | None = None, name: str = "torchrun"
) -> int:
    """Run torchrun (or the rendezvous store: ``name``) as a child, pass signals on, and return the pod's exit code
    (see :func:`pod_exit_code`).

    When a signal ended the launcher's wait, the launcher ends by that signal itself (``raise_signal``), so the
    container's status says the pod was signalled; as PID 1 of a container the kernel ignores a signal without a
    handler, so the code 128 + N it would have had is returned instead. ``scratch`` (default ``exit_dir``) is removed
    before that: the caller's cleanup would not run.
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
    meaning = exitcodes.exit_code_name(result)
    print(f"launch: {name} exited {code}; the pod exits {meaning} ({result})", file=sys.stderr)
    sys.stderr.flush()
    if received:
        shutil.rmtree(scratch or exit_dir, ignore_errors=True)  # the caller's cleanup would not run after the signal
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
