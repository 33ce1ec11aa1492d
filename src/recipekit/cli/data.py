"""The ``recipekit data`` commands: prepare a bundle's training data ahead of the run, and check it afterwards.

``recipekit data prepare BUNDLE`` runs the bundle's own prepare step (``python -m runtime.dataprep``, with only the
bundle on PYTHONPATH, as a pod runs it) in a child process on this machine's Python: the shards it writes are the
very bytes the Job would write, under the same fingerprint, so the Job finds them and starts training at once. The
child reports progress as JSON lines, drawn here as a progress bar (input bytes done, records/s, tokens/s, ETA).

Exit codes: 0 prepared (or found prepared); 2 the bundle, the data or this machine's Python stack is unusable (one
line, no traceback); 1 the prepare step failed otherwise (its traceback is shown).

``recipekit data verify BUNDLE`` finds the bundle's prepared dataset the same way (``python -m runtime.dataprep
--verify``: the fingerprint needs the bundle's tokenizer) and checks every shard file against the manifest's size
and sha256; ``--prepared DIR`` checks a ``<prepared_dir>/<fingerprint>`` directory directly, here, with no bundle
and no training stack (runtime/volume/verify.py is standard library only). Exit codes: 0 all match, 1 a shard is missing
or damaged, 2 nothing to check (no manifest, not a bundle, a streaming bundle, an unusable stack).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import yaml

from recipekit.base import yamlfile
from recipekit.bundle.files import RECIPE, RUNTIME
from recipekit.cli.common import SETTINGS, fail
from recipekit.recipe.volumes import under
from recipekit.runtime.boundary import exitcodes
from recipekit.runtime.volume.manifest import ManifestError
from recipekit.validate.shared.childpython import python_argv, safe_env

#: What the bundle's prepare step imports (its tokenizer comes through transformers).
STACK = ("transformers", "tokenizers", "numpy", "pyarrow", "yaml")
MODULE = f"{RUNTIME}.dataprep"


#: The options both commands take, declared once.
_VOLUME = click.option(
    "--volume",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the bundle's shared volume (cluster.mount_path) is mounted here (default: at the same path).",
)
_JSON = click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON document.")


@click.group("data", context_settings=SETTINGS)
def data_group() -> None:
    """Prepare a bundle's training data ahead of the run, and check prepared shards against their hashes.

    \b
    Examples:
      recipekit data prepare bundles/qwen2.5_7b_pretrain --workers 32  # cluster
      recipekit data verify bundles/qwen2.5_7b_pretrain  # cluster
    """


@data_group.command("prepare", context_settings=SETTINGS)
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--workers",
    type=click.IntRange(1, 4096),
    default=os.cpu_count() or 1,
    show_default="this machine's CPUs",
    help="Local worker processes (the Job uses every rank of every pod).",
)
@_VOLUME
@_JSON
def prepare_command(bundle: Path, workers: int, volume: Path | None, as_json: bool) -> None:
    """Tokenise, mask, pack and shard BUNDLE's training data on the shared volume, with the bundle's own code.

    The shards land in <data.prepared_dir>/<fingerprint>/ (default <cluster.output_dir>/prepared), where the
    Job looks first: a run whose data, tokenizer and row settings are equal reuses them instead of preparing.
    Afterwards, paste the printed data.num_rows/data.num_tokens into the recipe (or run recipekit plan --data)
    for an exact schedule.

    \b
    Examples:
      recipekit data prepare bundles/qwen2.5_7b_pretrain --workers 32  # cluster
      recipekit data prepare bundles/llama3_8b_sft --volume /mnt/pvc  # cluster
      recipekit data prepare bundles/tiny_sft --workers 2 --json  # cluster
    """
    problem = _unusable(bundle) or (_off_this_machine(bundle) if volume is None else None)
    if problem:
        fail(problem)
    command = python_argv("-m", MODULE, "--recipe", str(bundle / RECIPE), "--workers", str(workers))
    command += ["--progress", "json"] + (["--volume", str(volume)] if volume is not None else [])
    done = _run(command, _child_env(bundle))
    if done is None:
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(done, indent=2))
        return
    _summary(done)


def _child_env(bundle: Path) -> dict[str, str]:
    """The environment of the bundle's runtime: the bundle alone on PYTHONPATH, no rank of an outer launcher."""
    env = safe_env({k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")})
    env["PYTHONPATH"] = str(bundle.resolve())
    env.setdefault("TOKENIZERS_PARALLELISM", "false")  # one process per core already; no thread pools on top
    return env


@data_group.command("verify", context_settings=SETTINGS)
@click.argument("bundle", type=click.Path(path_type=Path), required=False)
@click.option(
    "--prepared",
    type=click.Path(path_type=Path),
    default=None,
    help="A <prepared_dir>/<fingerprint> directory to check directly (then no BUNDLE).",
)
@_VOLUME
@_JSON
def verify_command(bundle: Path | None, prepared: Path | None, volume: Path | None, as_json: bool) -> None:
    """Check BUNDLE's prepared shards against their manifest: every listed file there, of its size and sha256.

    The directory is the one the Job would use (<data.prepared_dir>/<fingerprint>/, found with the bundle's own
    code, so the data files and tokenizer must be reachable), or --prepared DIR. One line per missing, resized or
    altered shard and per extra file, then a verdict. Exit 0 when every shard matches, 1 when one is missing or
    damaged (delete the directory and prepare again), 2 when there is nothing to check. With RECIPEKIT_RUN_KEY_FILE
    set to the run key (docs/trust.md) the manifest's signature is checked too: shards rewritten together with
    their hashes in the manifest fail.

    \b
    Examples:
      recipekit data verify bundles/qwen2.5_7b_pretrain --volume /mnt/pvc
      recipekit data verify --prepared /mnt/pvc/runs/prepared/4f2a9c0e  # cluster
      recipekit data verify bundles/tiny_sft --json  # cluster
    """
    from recipekit.runtime.volume import trust, verify

    if (bundle is None) == (prepared is None):
        fail("give a BUNDLE or --prepared DIR (one of them)")
    if prepared is not None:
        if volume is not None:
            fail("--volume locates a bundle's data; with --prepared, give the directory as this machine sees it")
        try:
            report = verify.check(prepared, key=trust.load_key())
        except ManifestError as exc:
            fail(f"nothing to verify: {exc}")
        except trust.Untrusted as exc:
            fail(str(exc))
    else:
        assert bundle is not None
        problem = _unusable(bundle, "verify")
        if problem:
            fail(problem)
        command = python_argv("-m", MODULE, "--recipe", str(bundle / RECIPE), "--verify", "--progress", "json")
        command += ["--volume", str(volume)] if volume is not None else []
        process = subprocess.run(command, env=_child_env(bundle), stdout=subprocess.PIPE, text=True)
        verified = _last_event(process.stdout, "verified")
        if verified is None:
            sys.exit(2 if process.returncode == exitcodes.EXIT_USER_ERROR else 1)
        report = verified
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        for line in verify.lines(report):
            click.echo(line)
    sys.exit(0 if report["ok"] else 1)


def _last_event(stdout: str, kind: str) -> dict[str, Any] | None:
    """The last JSON line of ``stdout`` whose ``event`` is ``kind``."""
    found = None
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == kind:
            found = event
    return found


def _unusable(bundle: Path, action: str = "prepare") -> str | None:
    """Why BUNDLE cannot be prepared (or its shards verified) here, or None."""
    if not (bundle / RECIPE).is_file():
        return f"{bundle} is not a recipekit bundle (no {RECIPE})"
    if not (bundle / RUNTIME / "dataprep.py").is_file():
        return f"{bundle} was built by a recipekit without a prepare step: rebuild it with `recipekit build`"
    if action == "verify" and not (bundle / RUNTIME / "volume" / "verify.py").is_file():
        return f"{bundle} was built by a recipekit that cannot verify shards: rebuild it, or use --prepared DIR"
    try:  # the bundle may come from anyone: a non-UTF-8, deep or alias-bomb recipe.yaml is one line here
        raw = yamlfile.read(bundle / RECIPE)
    except OSError as exc:
        return f"{bundle / RECIPE}: cannot be read ({exc.strerror or exc})"
    except yaml.YAMLError as exc:  # yamlfile's refusals (UnsafeYAML) name the file and line themselves
        return str(exc) if isinstance(exc, yamlfile.UnsafeYAML) else f"{bundle / RECIPE}: {yamlfile.one_line(exc)}"
    if _streams(raw):
        nothing = "have no shards to verify" if action == "verify" else "do not prepare"
        return (
            f"{bundle} streams its data (data.streaming: true): streaming bundles tokenise while training and "
            f"{nothing}; build with data.streaming=false to prepare shards ahead"
        )
    missing = [name for name in STACK if importlib.util.find_spec(name) is None]
    if missing:  # the image's stack, which pods have
        return (
            f"{', '.join(missing)} not installed here: the bundle's prepare step needs pip install 'recipekit[train]'"
        )
    return None


def _off_this_machine(bundle: Path) -> str | None:
    """Without --volume, data on the pods' shared volume that this machine does not have at the pods' path: the
    volume is mounted elsewhere here (or not at all), which --volume says."""
    try:
        recipe = yamlfile.read(bundle / RECIPE)["recipe"]
        path, mount = str(recipe["data"]["path"]), str(recipe["cluster"]["mount_path"])
    except (OSError, yaml.YAMLError, TypeError, KeyError):
        return None  # the prepare step reports an unreadable recipe itself
    if not under(path, mount) or Path(path).exists():
        return None
    return (
        f"{path} is not on this machine: data.path is on the pods' shared volume, mounted at {mount} in the pods "
        f"(cluster.mount_path); pass --volume DIR, where that volume is mounted here"
    )


def _streams(raw: Any) -> bool:
    """Whether a bundle's recipe.yaml (``raw``, as loaded) says ``data.streaming: true`` (one without the key is the
    prepare step's to report)."""
    try:
        return bool(raw["recipe"]["data"].get("streaming", False))
    except (TypeError, KeyError, AttributeError):
        return False


def _run(command: list[str], env: dict[str, str]) -> dict[str, Any] | None:
    """Run the child, drawing its progress; its result, or exit with its code on failure."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    from recipekit.cli.terminal import console as make_console

    console = make_console(stderr=True)
    columns = (
        TextColumn("preparing", markup=False),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TextColumn("{task.fields[rates]}", markup=False),
    )
    done: dict[str, Any] | None = None
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("prepare", total=None, rates="")
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None
        for line in process.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "progress":
                progress.update(
                    task,
                    total=event["total_bytes"],
                    completed=event["bytes"] + event["reused_bytes"],
                    rates=_rates(event),
                )
            elif event.get("event") == "done":
                done = event
        code = process.wait()
    if code != exitcodes.EXIT_OK:
        sys.exit(2 if code == exitcodes.EXIT_USER_ERROR else 1)
    return done


def _rates(event: dict[str, Any]) -> str:
    eta = event.get("eta_s")
    return (
        f"{event['chunks']}/{event['total_chunks']} chunks · {event['records_per_s']:,.0f} records/s · "
        f"{event['tokens_per_s']:,.0f} tokens/s · ETA {f'{eta:.0f} s' if eta is not None else '?'}"
    )


def _summary(done: dict[str, Any]) -> None:
    verb = "found prepared" if done["reused"] else f"prepared in {done['seconds']:.1f} s by {done['workers']} workers"
    records = done["records"]
    click.echo(
        f"{click.style('data', fg='green')} {verb}: {done['train_rows']:,} train rows, {done['train_tokens']:,} "
        f"tokens ({done['row_kind']}), {done['eval_rows']:,} eval rows; {records['read']:,} records read, "
        f"{records['bad']:,} bad, {records['dropped']:,} dropped"
    )
    click.echo(f"shards: {done['directory']}")
    click.echo(f"exact schedule: data.num_rows={done['train_rows']} data.num_tokens={done['train_tokens']}")
    click.echo(f"  (recipekit plan <overrides> --data {done['manifest']})")
