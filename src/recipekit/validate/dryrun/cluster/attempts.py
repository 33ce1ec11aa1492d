"""The attempts of a dry run: start every pod, watch them, kill one when asked, stop the rest as Volcano does.

Each pod runs the Job's container command (the image's launcher) on the run files mounted read-only as the Job
mounts its ConfigMap (:mod:`~recipekit.validate.dryrun.workdir.podmount`), with what Volcano's env and svc plugins
inject (:func:`pod_environment`). While an attempt runs, :class:`DryRun` follows metrics.jsonl (steps and train.py's
records, filed into the :class:`~recipekit.validate.dryrun.cluster.attemptlog.Attempt`), reports each phase the pods
reach (:class:`~recipekit.validate.dryrun.cluster.startup.PhaseReporter`), and ends the attempt when every pod has
exited, one pod failed, the kill step was reached, or the deadline passed. Whether what happened is right is
:mod:`recipekit.validate.dryrun.judges.training`'s question, not this module's.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil
import yaml

from recipekit.bundle.files import JOB, LAUNCH, TRAIN_MODULE
from recipekit.recipe.k8snames import RENDEZVOUS_TASK, task_env_name
from recipekit.runtime.boundary import exitcodes, filenames, metricslog, runfiles
from recipekit.runtime.boundary.metricnames import PORT_ENV as METRICS_PORT_ENV
from recipekit.runtime.volume import trust
from recipekit.runtime.volume.hottier import HOT_DIR_ENV
from recipekit.runtime.volume.rowledger import ledger_sizes
from recipekit.validate.dryrun.cluster.attemptlog import Attempt, MetricsTail
from recipekit.validate.dryrun.cluster.pods import Pod, PodSet, loopback_interface
from recipekit.validate.dryrun.cluster.scrape import complete, metric_ports, scrape_pods
from recipekit.validate.dryrun.cluster.startup import PhaseReporter
from recipekit.validate.dryrun.options import DryRunOptions
from recipekit.validate.dryrun.workdir import podmount
from recipekit.validate.dryrun.workdir.engines import dryrun_engine
from recipekit.validate.dryrun.workdir.extensions import extensions_dir
from recipekit.validate.dryrun.workdir.workcopy import WorkCopy, set_master_port
from recipekit.validate.shared.ports import free_port

#: How often the pods' process trees and logs are looked at (metrics.jsonl is read every loop).
LOOK_EVERY_S = 0.5


@dataclass(frozen=True)
class LostNode:
    """The elastic drill (``--lose-pod``): pod ``pod`` is lost for good at step ``at_step`` and nobody restarts the
    others; with ``return_at``, capacity comes back at that step and Volcano's replacement pod starts."""

    pod: int
    at_step: int
    return_at: int | None = None


def node_local_dir(work: WorkCopy, index: int) -> Path:
    """The node-local disk of the "node" pod ``index`` runs on (the same node in every attempt)."""
    return work.root / "hot" / f"node-{index}"


#: The rendezvous pod's loopback address (an elastic Job's rendezvous task): past every worker pod's.
RENDEZVOUS_HOST = "127.0.0.254"


def pod_hosts(pods: int) -> list[str]:
    """Volcano's host list of the simulated pods: a loopback address of its own per pod (127.0.0.1 first, the
    master), as each pod of a Job has its own name. torchrun's elastic rendezvous orders its agents by the
    address they name themselves by (``--local-addr``), then by process id: with one address for all, which pod
    held rank 0 turned on which agent the kernel gave the lower pid. Distinct addresses sort as a Job's host names
    do (``-0`` first, ``-10`` before ``-2``), so rank 0 is pod 0's while it lives, as on a cluster."""
    if not 0 < pods < 254:
        raise ValueError(f"a dry run simulates 1 to 253 pods on this host's loopback, not {pods}")
    return [f"127.0.0.{index + 1}" for index in range(pods)]


def pod_environment(
    work: WorkCopy, index: int, options: DryRunOptions, metrics_port: int | None = None
) -> dict[str, str]:
    """What Volcano's env and svc plugins inject into pod ``index``, plus the laptop's runtime settings, the pod's own
    metrics port (on one host the pods cannot share the bundle's) and what the engine's pods need (its own
    interpreter first on PATH: workdir/engines)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "GROUP_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "NODE_RANK",
        )
        and not k.startswith(("TORCHELASTIC_", "VC_", "VK_"))
    }
    bin_dir = str(Path(sys.executable).parent)
    env.update(
        {
            "VC_TASK_INDEX": str(index),
            "VK_TASK_INDEX": str(index),
            f"VC_{work.task_env}_HOSTS": ",".join(pod_hosts(options.pods)),
            f"VC_{work.task_env}_NUM": str(options.pods),
            "PATH": bin_dir + os.pathsep + env.get("PATH", ""),
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TORCH_EXTENSIONS_DIR": str(extensions_dir()),
        }
    )
    if work.plan.elastic is not None:  # the svc plugin's entries of the rendezvous task (bundle/documents.py)
        meeting = task_env_name(RENDEZVOUS_TASK)
        env.update({f"VC_{meeting}_HOSTS": RENDEZVOUS_HOST, f"VC_{meeting}_NUM": "1"})
    env[trust.KEY_ENV] = str(work.run_key)  # the Secret the Job mounts (docs/trust.md)
    # the pod's node-local disk (train.hot_checkpoints): its own directory, kept across attempts as a hostPath is
    # on a node; pod ``index`` of every attempt runs on "node" ``index``
    env[HOT_DIR_ENV] = str(node_local_dir(work, index))
    if metrics_port is not None:
        env[METRICS_PORT_ENV] = str(metrics_port)
    if options.device == "cpu":
        env.update(
            DS_ACCELERATOR="cpu",
            CUDA_VISIBLE_DEVICES="",
            ASCEND_RT_VISIBLE_DEVICES="",
            TORCH_DEVICE_BACKEND_AUTOLOAD="0",
        )
        lo = loopback_interface()
        if lo:
            env["GLOO_SOCKET_IFNAME"] = lo
    else:  # pod ``index`` gets its own devices, as the device plugin would give it
        per_pod = options.procs_per_pod
        devices = ",".join(str(index * per_pod + k) for k in range(per_pod))
        visible = "CUDA_VISIBLE_DEVICES" if options.device == "cuda" else "ASCEND_RT_VISIBLE_DEVICES"
        env.update({"DS_ACCELERATOR": options.device, visible: devices})
    env.update(dryrun_engine(work.plan.engine).pod_environment(options, env))
    return env


class DryRun:
    """One dry run of a prepared work copy: attempts of N pods, an optional kill, what each attempt observed."""

    def __init__(
        self,
        work: WorkCopy,
        options: DryRunOptions,
        progress: Callable[[str], None],
        deadline: float,
        held: tuple[int, ...] = (),
    ):
        self.work, self.options, self.progress, self.deadline = work, options, progress, deadline
        #: lock descriptors every pod inherits, so the locks stay held while a pod lives (even past recipekit)
        self.held = held
        self.podset = PodSet()
        #: Each pod's first metrics port (rank 0 is pod 0's local rank 0), or None: the bundle serves no metrics;
        #: which pods serve (all, or pod 0 for ``ops.metrics_ranks: rank0``).
        self.pods: list[Pod] = []
        self.resize(options.pods)
        self.metrics = MetricsTail(work.output_dir / filenames.METRICS_FILE)
        self.attempts: list[Attempt] = []
        #: the attempts that drained a checkpoint from the hot tier to the shared volume (train.hot_checkpoints)
        self.drained: set[int] = set()
        self.ports: set[int] = set()
        try:
            spec = json.loads((work.bundle / LAUNCH).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            spec = {}
        self.module = str(spec.get("module") or TRAIN_MODULE)
        try:  # the Job whose policies answer a failed pod (validate/controller.py)
            self.job: dict[str, Any] = yaml.safe_load((work.bundle / JOB).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError):
            self.job = {}
        self.nproc = int(spec.get("nproc_per_node") or 1)
        #: an elastic Job's rendezvous pod (launch.json ``elastic.rendezvous``), started with every attempt
        self.rendezvous = self._rendezvous_pod() if (spec.get("elastic") or {}).get("rendezvous") else None
        #: the environment every pod of this attempt started with (a restart request, the hold), for a pod started
        #: again inside the attempt (the elastic drill's returning node)
        self.start_env: dict[str, str] = {}
        #: the elastic drill: the pods lost and not back, the attempt they were lost in, the hold's release file
        self.away: set[int] = set()
        self.lost_attempt: int | None = None
        self.release = work.root / "hold-released"

    def resize(self, pods: int) -> None:
        """The Job's pods from now on: ``pods`` of them, each with what Volcano injects for a Job of that size (a
        Job rebuilt on fewer nodes after one is lost for good, plan/rescale.py)."""
        self.options = replace(self.options, pods=pods)
        self.metrics_ports, self.serving_pods = metric_ports(self.work, pods)
        self.pods = [
            self.podset.add(
                Pod(
                    i,
                    podmount.pod_command(self.work.bundle, self.work.root, i),
                    podmount.pod_root(self.work.root, i),
                    pod_environment(self.work, i, self.options, self.metrics_ports[i] if self.metrics_ports else None),
                    self.work.logs / f"pod-{i}.log",
                    pass_fds=self.held,
                )
            )
            for i in range(pods)
        ]

    def _rendezvous_pod(self) -> Pod:
        """The rendezvous task's one pod: the Job's container command and arguments for that task (the launcher
        serving torchrun's store), with what Volcano injects into it."""
        work = self.work
        return self.podset.add(
            Pod(
                0,
                podmount.pod_command(work.bundle, work.root, 0, RENDEZVOUS_TASK),
                podmount.pod_root(work.root, 0, RENDEZVOUS_TASK),
                pod_environment(work, 0, self.options),
                work.logs / f"{RENDEZVOUS_TASK}-0.log",
                task=RENDEZVOUS_TASK,
            )
        )

    # -- one attempt: start every pod, watch until done / failed / killed / timed out
    def attempt(self, kill_at: int | None, env: dict[str, str] | None = None, lost: LostNode | None = None) -> Attempt:
        """Start every pod (``env`` added to each pod's environment: a restart request, say) and watch them.

        ``lost``: the elastic drill. The lost pod is killed and stays away (until ``lost.return_at``), nobody
        touches the others, and each worker group torchrun's agents form from then on is an attempt of its own
        (:meth:`_regroup`); the last one is returned, every one is in :attr:`attempts`."""
        number = len(self.attempts)
        port = free_port(self.ports)
        self.ports.add(port)
        set_master_port(self.work, port)
        attempt = Attempt(number, port, time.monotonic())
        attempt.ledger_from = ledger_sizes(self.work.output_dir)
        self.attempts.append(attempt)
        label = "first start" if number == 0 else "restart (Volcano RestartJob)"
        # With a kill at step S every rank holds after step S until the kill: it lands at S whatever the load.
        held_at = lost.at_step if lost is not None else kill_at
        hold = {exitcodes.HOLD_AT_STEP_ENV: str(held_at)} if held_at is not None else {}
        if lost is not None:  # the pods that are left go on once the lost one is killed
            self.release.unlink(missing_ok=True)
            hold[exitcodes.HOLD_RELEASE_ENV] = str(self.release)
            if lost.return_at is not None:  # and grow back at exactly that step, once the replacement joined
                hold[exitcodes.HOLD_SHRUNK_AT_STEP_ENV] = str(lost.return_at)
        self.start_env = {**hold, **(env or {})}
        self._start_all(attempt, f"attempt {number}: {label}", port)
        phases = PhaseReporter(
            number,
            {pod.index: (pod.log_path, attempt.log_offsets[pod.index]) for pod in self.pods},
            self.module,
            self.nproc,
            self._cmdlines,
            self.progress,
        )
        last_look = 0.0
        while True:
            now = time.monotonic()
            if now - last_look > LOOK_EVERY_S:
                self.podset.remember()
                phases.poll()
                self._settle(attempt)
                last_look = now
            attempt = self._read_metrics(attempt, phases, now, regroup=lost is not None)
            if kill_at is not None and attempt.steps and attempt.steps[-1].step >= kill_at:
                phases.expected = (int(self.options.kill_pod or 0), f"pod {self.options.kill_pod} was killed")
                self._kill(attempt)
                break
            if lost is not None:
                self._lose_or_return(attempt, lost, phases)
            codes = {pod.index: pod.poll() for pod in self.pods if pod.index not in self.away}
            if attempt.first_failure is None:
                attempt.first_failure = next(((i, c) for i, c in codes.items() if c not in (None, 0)), None)
            if all(code is not None for code in codes.values()):
                attempt.outcome = "completed" if all(code == 0 for code in codes.values()) else "failed"
                break
            if any(code not in (None, 0) for code in codes.values()):
                # A failed pod: its peers fail or hang in their next collective. Give them a moment, then stop them.
                self._stop_all(grace=min(self.options.grace, 10.0))
                attempt.outcome = "failed"
                break
            if now > self.deadline:
                for pod in self.pods:
                    pod.kill()
                attempt.outcome = "timeout"
                break
            time.sleep(0.01)
        attempt = self._read_metrics(attempt, phases, time.monotonic(), regroup=lost is not None)  # the last records
        if self.rendezvous is not None:  # Volcano reclaims it as the Job completes, deletes it as the Job restarts
            self.rendezvous.terminate(grace=5.0)
        phases.poll()  # and the pods' last words (train.py: ..., launch: ...)
        attempt.exit_codes = {pod.index: pod.poll() for pod in self.pods}
        attempt.ended = time.monotonic()
        attempt.ledger_to = ledger_sizes(self.work.output_dir)
        return attempt

    def _start_all(self, attempt: Attempt, header: str, port: int) -> None:
        """Start the Job's pods together (an elastic Job's rendezvous pod first; the agents retry until its store
        answers), each log's part of ``attempt`` from here, and say where they meet."""
        if self.rendezvous is not None:
            self._start(self.rendezvous, f"{header}, rendezvous port {port}")
        for pod in self.pods:
            attempt.log_offsets[pod.index] = pod.log_size()
            self._start(pod, f"{header}, master port {port}")
        meeting = f"(master {pod_hosts(1)[0]}:{port})"  # the first pod's address is the master's
        if self.rendezvous is not None:
            meeting = f"and the rendezvous pod ({RENDEZVOUS_HOST}:{port})"
        self.progress(
            f"attempt {attempt.number}: {len(self.pods)} pod(s) {meeting} running the launcher; "
            f"logs in {self.work.logs}"
        )

    def _start(self, pod: Pod, header: str) -> None:
        """Start ``pod`` as the Job's pod starts: its node-local disk, the ConfigMap mounted read-only, and the digest
        the Job's container carries (bundle/runfiles.py)."""
        if self.work.hot_tier == "emptyDir" and pod.task is None:  # deleted with its pod: every start's is new
            shutil.rmtree(node_local_dir(self.work, pod.index), ignore_errors=True)
        digest = podmount.mount(self.work.bundle, self.work.root, pod.index, pod.task)
        mounted = {runfiles.DIGEST_ENV: digest} if digest else {}
        pod.start(header=header, env={**self.start_env, **mounted})

    def _lose_or_return(self, attempt: Attempt, lost: LostNode, phases: PhaseReporter) -> None:
        """The elastic drill's two moments: the node goes at ``lost.at_step`` (SIGKILL, its whole tree; the others
        are released from their hold and left alone), and its capacity comes back at ``lost.return_at``."""
        step = attempt.steps[-1].step if attempt.steps else 0
        if self.lost_attempt is None and step >= lost.at_step:
            victim = self.pods[lost.pod]
            attempt.killed_processes = len(victim.alive())
            victim.kill()
            self.release.touch()
            self.away.add(lost.pod)
            self.lost_attempt = attempt.number
            attempt.killed_pod, attempt.killed_at, attempt.killed_step = lost.pod, time.monotonic(), step
            phases.expected = (lost.pod, f"pod {lost.pod} was lost for good")
            self.progress(
                f"pod {lost.pod}'s node is gone for good at step {step}: its replacement stays Pending (no "
                "capacity); nobody restarts the other pods"
            )
        elif lost.return_at is not None and lost.pod in self.away and attempt.number > (self.lost_attempt or 0):
            if step >= lost.return_at:
                self.away.discard(lost.pod)
                pod = self.pods[lost.pod]
                attempt.log_offsets[lost.pod] = pod.log_size()
                self._start(pod, f"attempt {attempt.number}: capacity returned, pod {lost.pod} scheduled again")
                self.progress(f"capacity returned at step {step}: Volcano's replacement for pod {lost.pod} starts")

    def _regroup(self, attempt: Attempt, now: float) -> Attempt:
        """A worker group's start after the first (torchrun's agents restarted the workers at another size): from
        here on the records are the next attempt's, its rows the ledger's lines from here."""
        attempt.outcome = attempt.outcome or "resized"
        attempt.ended = now
        attempt.exit_codes = {pod.index: pod.poll() for pod in self.pods}
        attempt.ledger_to = ledger_sizes(self.work.output_dir)
        following = Attempt(len(self.attempts), attempt.port, now)
        following.ledger_from = attempt.ledger_to
        following.log_offsets = {pod.index: pod.log_size() for pod in self.pods}
        self.attempts.append(following)
        self.progress(f"attempt {following.number}: torchrun's agents formed a new worker group (no pod restarted)")
        return following

    def _read_metrics(self, attempt: Attempt, phases: PhaseReporter, now: float, regroup: bool = False) -> Attempt:
        """File metrics.jsonl's new records under ``attempt`` (``regroup``: a new worker group's start opens the next
        attempt, :meth:`_regroup`); the attempt the last record went to."""
        for record in self.metrics.read():
            if regroup and record.get("event") == metricslog.EVENT_START and attempt.events(metricslog.EVENT_START):
                attempt = self._regroup(attempt, now)
            step = attempt.observe(record, now)
            if step is not None:
                self._scrape(attempt, step.step)
                self.progress(
                    f"attempt {attempt.number}: step {step.step}/{self.options.steps}, loss {step.loss:.4f}"
                    if step.loss is not None
                    else f"attempt {attempt.number}: step {step.step}"
                )
            elif "event" in record:
                phases.record(record)
                if record.get("event") == metricslog.EVENT_CHECKPOINT_DRAINED:
                    self.drained.add(attempt.number)
                if record.get("event") in (metricslog.EVENT_CHECKPOINT, metricslog.EVENT_CHECKPOINT_DRAINED):
                    self._scrape(attempt, int(record.get("step") or 0) + 1)
        return attempt

    def _scrape(self, attempt: Attempt, step: int) -> None:
        """Read the serving pods' metrics endpoints once this attempt has checkpointed (so every gauge has a value).

        Rank 0 writes the checkpoint record when its own save is over; another rank times its save a moment later,
        so a read at that record is provisional, and read again at each look (:meth:`_settle`) until it settles: a
        read with every value on every pod, or one once rank 0 logged a step after the save (that step's
        collectives waited for every rank to start it, past its save). An attempt whose only save is its last
        keeps its best read when the pods end first. A gauge lives in its process: a restarted attempt's processes
        have no checkpoint time and no jump ratio until they have saved and logged steps of their own, whatever
        step they resumed at."""
        saved = attempt.events(metricslog.EVENT_CHECKPOINT)
        if not self.metrics_ports or step <= self.options.save_steps or not saved:
            return
        if self.work.hot_tier != "none" and attempt.number not in self.drained:
            return  # the total time of a save has its value once the checkpoint is drained to the shared volume
        good = attempt.scraped if attempt.scraped is not None and not attempt.scraped.get("error") else None
        if good is not None and good["settled"]:
            return
        scraped = scrape_pods({pod: self.metrics_ports[pod] for pod in self.serving_pods})
        if scraped.get("error") and good is not None:
            return  # a pod ending after a good provisional read
        scraped["step"] = step
        stepped_past = bool(attempt.steps) and attempt.steps[-1].step > int(saved[0].get("step") or 0)
        scraped["settled"] = stepped_past or complete(scraped)
        attempt.scraped = scraped

    def _settle(self, attempt: Attempt) -> None:
        """Read a provisional read's endpoints again (at each look, while the pods run): the last save's gauges of
        the ranks that time it after rank 0 appear without a step record to wait for."""
        if attempt.scraped is not None and not attempt.scraped["settled"]:
            self._scrape(attempt, int(attempt.scraped["step"]))

    def _cmdlines(self, index: int) -> list[list[str]]:
        found = []
        for process in self.pods[index].remember():
            try:
                found.append(process.cmdline())
            except psutil.Error:
                continue
        return found

    def _kill(self, attempt: Attempt) -> None:
        index = self.options.kill_pod
        assert index is not None
        victim = self.pods[index]
        processes = len(victim.alive())
        victim.kill()  # SIGKILL, the whole tree: a node going away
        attempt.killed_pod = index
        attempt.killed_at = time.monotonic()
        attempt.killed_step = attempt.steps[-1].step
        attempt.killed_processes = processes
        attempt.outcome = "killed"
        self.progress(
            f"killed pod {index} ({processes} processes) at step {attempt.killed_step}; deleting the "
            f"others as RestartJob does (SIGTERM, {self.options.grace:.0f} s grace, SIGKILL)"
        )
        self._stop_all(grace=self.options.grace)

    def _stop_all(self, grace: float) -> None:
        threads = [threading.Thread(target=pod.terminate, args=(grace,)) for pod in self.pods if pod.alive()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def tails(self, lines: int = 25) -> dict[str, str]:
        """The last lines of every pod's log, for a failed result's details."""
        return {f"pod-{pod.index}": pod.tail(lines) for pod in self.pods}
