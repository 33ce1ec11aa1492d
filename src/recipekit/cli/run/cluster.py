"""``recipekit submit``, ``status``, ``logs`` and ``cancel``: a bundle's run on the cluster, through the kubeconfig.

Parsing and printing only (the work is :mod:`recipekit.cluster`'s). Every line fits the terminal (80 columns when
piped), text from the cluster is printed as plain text with its control characters escaped, and the exit codes are
the command line's own (``recipekit --help``): 1 for a refusal or a run that ended without completing, 2 for unusable
input, 4 when the cluster could not be asked.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from recipekit.cli.common import SETTINGS, fail, user_errors
from recipekit.recipe.schema import printable

#: Exit code when the cluster could not be asked (unreachable, credentials refused, reading the run forbidden).
EXIT_NO_CLUSTER = 4
#: The width of the label column of ``status``.
LABEL = 10
#: A space the line is not broken at (within one figure: "0.55 s/step"), printed as a space.
KEEP = "\u00a0"


def _width() -> int:
    return max(40, shutil.get_terminal_size((80, 24)).columns)


def say(text: str, label: str | None = None, *, err: bool = False) -> None:
    """``text`` after ``label`` (padded to the label column; "" for a row under the one above), wrapped between words
    at the terminal's width, its continuation lines under the text; control characters escaped (text from a
    cluster is anyone's)."""
    first = f"{label:<{LABEL}}" if label is not None else ""
    indent = " " * (LABEL if label is not None else 2)
    click.echo(
        textwrap.fill(
            printable(text),
            width=_width(),
            initial_indent=first,
            subsequent_indent=indent,
            break_on_hyphens=False,
            break_long_words=True,
        ).replace(KEEP, " "),
        err=err,
    )


def _no_cluster(message: str) -> NoReturn:
    say(f"error: {message}", err=True)
    sys.exit(EXIT_NO_CLUSTER)


def cluster_command(func: Callable[..., Any]) -> Callable[..., Any]:
    """kubectl's connection options, the client library's absence as one line, a ClusterError as exit 4."""

    def run(*args: Any, **kwargs: Any) -> Any:
        if importlib.util.find_spec("kubernetes") is None:  # found, not imported: the cluster package imports it
            fail("the cluster commands need the kubernetes package: pip install 'recipekit[cluster]'")
        from recipekit.cluster.connect import ClusterError

        try:
            return func(*args, **kwargs)
        except ClusterError as err:
            _no_cluster(str(err))

    run.__name__, run.__doc__ = func.__name__, func.__doc__
    for option in reversed(
        [
            click.option(
                "--kubeconfig", type=click.Path(path_type=Path), help="Kubeconfig file (default: as kubectl)."
            ),
            click.option("--context", help="Kubeconfig context (default: its current context)."),
            click.option("-n", "--namespace", help="Namespace (default: the bundle's, else the context's)."),
        ]
    ):
        run = option(run)
    return user_errors(run)


def _connect(kubeconfig: Path | None, context: str | None, namespace: str | None) -> Any:
    from recipekit.cluster.connect import connect

    return connect(kubeconfig, context, namespace)


def _run(run: str, kubeconfig: Path | None, context: str | None, namespace: str | None) -> tuple[Any, Any]:
    """RUN located (a bundle fixes the namespace: -n may only repeat it) and the connection to ask about it."""
    from recipekit.cluster.objects import locate

    ref = locate(run)
    if ref.namespace is not None and namespace is not None and namespace != ref.namespace:
        fail(f"{run} is a bundle of namespace {ref.namespace}, not {namespace} (-n)")
    return ref, _connect(kubeconfig, context, ref.namespace or namespace)


@click.command("submit", context_settings=SETTINGS)
@click.argument("bundle", type=click.Path(path_type=Path))
@cluster_command
def submit_command(bundle: Path, kubeconfig: Path | None, context: str | None, namespace: str | None) -> None:
    """Submit BUNDLE's run: a server-side dry run first, then the run files' ConfigMap and the Volcano Job.

    The dry run (dryRun=All) asks the API server and the admission webhooks (Volcano's validatejob.volcano.sh
    among them) about both objects; the run-key Secret, the PVC, the image pull Secrets, the service account and
    the priority class the pods need are checked to exist. Every refusal is printed, one line each, and nothing is
    created while there is one (exit 1). Then the ConfigMap is applied and the Job created; the run's name is
    printed. The namespace is the bundle's (cluster.namespace).

    Needs a Kubernetes cluster (the kubeconfig's, as kubectl finds it) and pip install 'recipekit[cluster]'.

    \b
    Examples:
      recipekit submit bundles/tiny_sft
      recipekit submit bundles/llama3_8b_sft --context prod-910b
    """
    from recipekit.cluster.objects import read_bundle
    from recipekit.cluster.submit import Refused, submit

    objects = read_bundle(bundle)
    if namespace is not None and namespace != objects.namespace:
        fail(f"the bundle's namespace is {objects.namespace}, not {namespace} (-n): rebuild with cluster.namespace")
    conn = _connect(kubeconfig, context, objects.namespace)
    try:
        done = submit(conn, objects)
    except Refused as refused:
        for warning in refused.warnings:
            say(f"warning: {warning}", err=True)
        say(
            f"error: {objects.name} was not submitted ({len(refused.lines)} problem(s)); nothing was created:", err=True
        )
        for line in refused.lines:
            say(f"- {line}", err=True)
        sys.exit(1)
    for warning in done.warnings:
        say(f"warning: {warning}", err=True)
    run_id = f" (run id {done.run_id})" if done.run_id else ""
    say(f"submitted {done.name}{run_id} to namespace {done.namespace}, queue {done.queue}")
    say(f"watch: recipekit status {done.name} -n {done.namespace}")
    say(f"logs:  recipekit logs {done.name} -n {done.namespace} -f")


@click.command("status", context_settings=SETTINGS)
@click.argument("run")
@click.option(
    "--volume",
    type=click.Path(path_type=Path),
    help="Where the shared volume (cluster.pvc_claim) is mounted on this machine: the run's progress is read there.",
)
@cluster_command
def status_command(
    run: str, volume: Path | None, kubeconfig: Path | None, context: str | None, namespace: str | None
) -> None:
    """Show RUN (a bundle directory, or the Job name submit printed): the Volcano Job's phase and attempt, its
    PodGroup's phase and why it waits (devices, taints, queue quota, a missing Secret, an image not pulled), each
    pod's phase, restarts and attempt, and — where the shared volume is reachable — the last step, loss, tokens/s
    and ETA.

    Exit 0 while the run is pending, running or completed; 1 when its Job ended without completing (Failed,
    Aborted, Terminated).

    Needs a Kubernetes cluster (the kubeconfig's, as kubectl finds it) and pip install 'recipekit[cluster]'.

    \b
    Examples:
      recipekit status bundles/tiny_sft --volume /mnt/pvc
      recipekit status tiny-sft-9dff15 -n team-a
    """
    from recipekit.cluster.status import status

    ref, conn = _run(run, kubeconfig, context, namespace)
    found = status(conn, ref, volume)
    for warning in found.warnings:
        say(f"warning: {warning}", err=True)
    for label, text in status_lines(found):
        say(text, label)
    sys.exit(1 if found.ended_badly else 0)


def status_lines(found: Any) -> list[tuple[str, str]]:
    """The status as (label, text) lines: the Job, the PodGroup, why it waits, the pods, the training."""
    lines = [("run", f"{found.name} · namespace {found.namespace} · queue {found.queue}")]
    job = f"{found.phase}, attempt {found.attempt} of {found.max_retry}"
    lines.append(("job", job + (f": {found.message}" if found.message else "")))
    if found.podgroup_phase is not None:
        gang = f" (gang of {found.min_member})" if found.min_member else ""
        lines.append(("podgroup", f"{found.podgroup_phase}: {found.running} pod(s) running{gang}"))
    else:
        lines.append(("podgroup", "not created yet (Volcano's controller makes it with the Job)"))
    lines += [("waiting" if i == 0 else "", reason.line()) for i, reason in enumerate(found.reasons)]
    for i, pod in enumerate(found.pods):
        short = pod.name.removeprefix(f"{found.name}-")
        attempt = f"  attempt {pod.attempt}" if pod.attempt is not None else ""
        wait = f"  {pod.waiting[0]}" if pod.waiting else ""
        lines.append(("pods" if i == 0 else "", f"{short}  {pod.phase}  restarts {pod.restarts}{attempt}{wait}"))
    if not found.pods:
        lines.append(("pods", "none yet"))
    lines.append(("training", progress_text(found.progress, found.progress_note)))
    return lines


def progress_text(progress: Any, note: str | None) -> str:
    if progress is None:
        return f"not read here: {note}"
    if progress.step is None:
        return "no step logged yet"
    total = f" of {progress.total_steps}" if progress.total_steps else ""
    parts = [("finished at " if progress.done else "") + f"step {progress.step}{total}"]
    if progress.loss is not None:
        parts.append(f"loss {progress.loss:.4f}")
    if progress.tokens_per_s_per_device is not None:
        parts.append(f"{progress.tokens_per_s_per_device:,.0f} tokens/s per device")
    if progress.step_s is not None:
        parts.append(f"{progress.step_s:.2f} s/step")
    if progress.eta_s is not None:
        parts.append(f"ETA {duration(progress.eta_s)}")
    parts.append(f"{progress.starts} start(s) of train.py")
    return " · ".join(part.replace(" ", KEEP) for part in parts)


def duration(seconds: float) -> str:
    minutes = int(round(seconds / 60))
    if minutes < 1:
        return f"{seconds:.0f} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min"


@click.command("logs", context_settings=SETTINGS)
@click.argument("run")
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the pod logs, until its container ends.")
@click.option("--pod", "index", type=click.IntRange(min=0), default=0, show_default=True, help="The pod's index.")
@cluster_command
def logs_command(
    run: str, follow: bool, index: int, kubeconfig: Path | None, context: str | None, namespace: str | None
) -> None:
    """Print the log of RUN's pod (RUN: a bundle directory, or the Job name submit printed): pod 0, the first rank's,
    unless --pod says another. Every line is printed as plain text, its control characters escaped.

    Exit 1 when the pod's container has not started yet (no log to show).

    Needs a Kubernetes cluster (the kubeconfig's, as kubectl finds it) and pip install 'recipekit[cluster]'.

    \b
    Examples:
      recipekit logs bundles/tiny_sft -f
      recipekit logs tiny-sft-9dff15 --pod 1 -n team-a
    """
    from recipekit.cluster.logs import NoLog, pod_name, stream

    ref, conn = _run(run, kubeconfig, context, namespace)
    pod_namespace, pod = pod_name(conn, ref, index)
    try:
        stream(conn, pod_namespace, pod, follow, click.echo)
    except NoLog as nolog:
        say(f"error: {nolog}", err=True)
        sys.exit(1)


@click.command("cancel", context_settings=SETTINGS)
@click.argument("run")
@cluster_command
def cancel_command(run: str, kubeconfig: Path | None, context: str | None, namespace: str | None) -> None:
    """Cancel RUN (a bundle directory, or the Job name submit printed): delete its Volcano Job. Its pods get SIGTERM
    and their grace period to save a last checkpoint; a later submit of the bundle resumes from it. The run files'
    ConfigMap stays (the next submit replaces it).

    Needs a Kubernetes cluster (the kubeconfig's, as kubectl finds it) and pip install 'recipekit[cluster]'.

    \b
    Examples:
      recipekit cancel bundles/tiny_sft
      recipekit cancel tiny-sft-9dff15 -n team-a
    """
    from recipekit.cluster.logs import cancel

    ref, conn = _run(run, kubeconfig, context, namespace)
    phase = cancel(conn, ref)
    say(f"cancelled {ref.job_name} in namespace {ref.namespace or conn.namespace} (it was {phase}): its pods stop")
