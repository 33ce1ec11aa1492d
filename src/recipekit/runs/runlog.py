"""What a training run left behind, read into typed records: the input of ``recipekit report`` and ``compare``.

A run is found from one of four paths: the run's output directory (metrics.jsonl, recipekit-run.json,
cluster-check.json), a bundle (its ``training_arguments.output_dir``, below ``--volume`` when the shared volume is
mounted elsewhere here), a dry run's work directory (the twin's own bundle and output directory), or a baseline file
that ``recipekit report --export-baseline`` wrote. Beside the run, the bundle's plan.json (the prediction) and its
manifest (recipe, versions, image) are read when there is a bundle to read them from.

Only JSON and YAML are parsed (never a pickle: training_args.bin is left alone), every file has a size limit, and
a metrics line that does not parse or is too long is skipped and counted, so a hostile or half-written directory
gives a report with a warning rather than a crash or an exhausted memory.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recipekit.base import yamlfile
from recipekit.base.errors import Problem, RecipeError
from recipekit.base.limits import BUNDLE_FILE, read_regular
from recipekit.base.paths import did_you_mean
from recipekit.runs import runfiles
from recipekit.runtime.boundary import filenames, jsonfile, metricslog
from recipekit.validate.dryrun.workdir.kept import MARKER, kept_runs

#: metrics.jsonl is read up to this many bytes (a month-long run logging every step stays far below).
MAX_METRICS_BYTES = 256 * 1024 * 1024
#: A metrics line longer than this is skipped (a Trainer log is a few hundred bytes).
MAX_LINE_BYTES = 64 * 1024
#: metrics.jsonl lines read (a week of one log per second is 600,000): with the byte bound, what the report holds
#: stays bounded (ten million short lines would otherwise be ten million dicts: gigabytes from 240 MB).
MAX_METRICS_LINES = 1_000_000
#: A baseline file's format marker; another value is refused.
BASELINE_FORMAT = "recipekit-baseline/1"
#: The dry run's work directory marker (its one home: validate.dryrun.workdir.kept).
DRYRUN_MARKER = MARKER

#: The per-step figures a training log carries (callbacks.py and health.py add all after the first three; the last two
#: are the measured peak memory, GiB).
TRAIN_KEYS = (
    "loss",
    "learning_rate",
    "grad_norm",
    "tokens_per_second_per_device",
    "tflops_per_device",
    "mfu",
    "hfu",
    "step_time_s",
    "dataloader_wait_fraction",
    metricslog.PEAK_DEVICE_MEMORY_KEY,
    metricslog.PEAK_HOST_MEMORY_KEY,
)
#: The per-step figures an evaluation log carries.
EVAL_KEYS = ("eval_loss",)
#: Event records worth keeping in a baseline (the rest are about the run's machinery, not its numbers).
_BASELINE_EVENTS = (
    metricslog.EVENT_START,
    metricslog.EVENT_DONE,
    metricslog.EVENT_PREEMPTED,
    metricslog.EVENT_CHECKPOINT,
    metricslog.EVENT_PREFLIGHT,
    metricslog.EVENT_DATA,
)

#: Records a restarted attempt writes before its start record: they end no earlier attempt (its downtime includes them).
_BEFORE_START = (metricslog.EVENT_PHASE, metricslog.EVENT_DATA, metricslog.EVENT_PREFLIGHT, metricslog.EVENT_ADAPTED)

Series = list[tuple[int, float]]


@dataclass(frozen=True)
class Attempt:
    """One start of train.py: from its ``start`` record to the next one."""

    number: int
    started: float | None  # Unix time of the start record (None: an older runtime wrote no times)
    ended: float | None  # time of the attempt's last record
    resume_step: int | None  # the checkpoint step it continued from (None: from scratch)
    first_step: int | None  # first training step it logged
    last_step: int | None  # last training step it logged
    preempted: bool  # it ended with SIGTERM → checkpoint → exit


@dataclass(frozen=True)
class Restart:
    """An interruption and the recovery after it: the attempt that ended, the one that continued."""

    attempt: int  # the number of the attempt that continued
    interrupted_at_step: int | None  # last step logged before the interruption
    resumed_step: int | None  # the checkpoint the next attempt continued from (None: from scratch)
    preempted: bool
    downtime_s: float | None  # last record of the interrupted attempt → start record of the next
    recovery_s: float | None  # last record of the interrupted attempt → first step past the interrupted one

    @property
    def replayed_steps(self) -> int:
        """Steps trained twice: between the resumed checkpoint and the interruption."""
        if self.interrupted_at_step is None:
            return 0
        return max(0, self.interrupted_at_step - (self.resumed_step or 0))


@dataclass
class RunLog:
    """A run as the report and compare see it; every series is (step, value), the final attempt's value per step."""

    label: str
    output_dir: Path | None = None
    series: dict[str, Series] = field(default_factory=dict)
    checkpoints: list[dict[str, float]] = field(default_factory=list)  # step, seconds, bytes
    attempts: list[Attempt] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    start: dict[str, Any] | None = None  # the last start record
    done: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None  # the Trainer's final summary log (train_runtime, train_loss)
    preflight: dict[str, Any] | None = None  # cluster-check.json (or the preflight record)
    run_record: dict[str, Any] | None = None
    plan: dict[str, Any] | None = None  # plan.json: the estimate the bundle was built with
    manifest: dict[str, Any] | None = None  # name, choices, overrides, versions, recipe (no file hashes)
    recipe_digest: str | None = None  # sha256 of the bundle's recipe.yaml
    image: str | None = None
    records: list[dict[str, Any]] = field(default_factory=list)  # the records a baseline keeps
    warnings: list[str] = field(default_factory=list)

    def values(self, key: str) -> list[float]:
        return [v for _, v in self.series.get(key, [])]

    @property
    def recipe(self) -> dict[str, Any]:
        return dict((self.manifest or {}).get("recipe") or {})

    @property
    def versions(self) -> dict[str, str]:
        """The bundle's pinned versions, then what preflight saw on the pods (``pods:`` prefixed)."""
        found = {str(k): str(v) for k, v in ((self.manifest or {}).get("versions") or {}).items()}
        for check in (self.preflight or {}).get("checks") or []:
            if isinstance(check, dict) and isinstance(check.get("versions"), dict):
                found.update({f"pods:{k}": str(v) for k, v in check["versions"].items() if k != "pod"})
        return found

    @property
    def final_step(self) -> int | None:
        steps = [s for s, _ in self.series.get("loss", [])]
        return max(steps) if steps else None


# ----------------------------------------------------------------------------------------------------- reading
def _json_file(path: Path, fields: dict[str, Any] | None = None, within: Path | None = None) -> Any:
    """A side file, bounded and typed (runfiles.document): None when it is absent, RecipeError when it is hostile."""
    return runfiles.document(path, fields or {}, within)


_number = runfiles.figure
_step = runfiles.step


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The JSON object lines of a metrics file, read line by line up to the bounds, and warnings about what was
    skipped: a line that is not JSON, too long, too deep, or whose fields have the wrong types."""
    warnings: list[str] = []
    try:
        found = jsonfile.read_lines(
            path,
            max_bytes=MAX_METRICS_BYTES,
            max_line_bytes=MAX_LINE_BYTES,
            max_lines=MAX_METRICS_LINES,
            within=path.parent,
            keep=_typed_record,
        )
    except OSError as exc:
        raise RecipeError([Problem(str(path), f"cannot be read ({exc.strerror or exc})")]) from None
    if found.cut:
        warnings.append(f"{path.name}: {found.cut}")
    if found.refused:
        number, reason = found.refused[0]
        warnings.append(f"{path.name}: {len(found.refused)} line(s) skipped (line {number}: {reason})")
    return [record for _, record in found.values], warnings


def _typed_record(value: Any) -> Any:
    problem = runfiles.record_problem(value, metricslog.EVENT_START)
    if problem:
        raise ValueError(problem)
    return value


def from_records(label: str, records: list[dict[str, Any]]) -> RunLog:
    """The series, attempts and restarts of a metrics file's records (pure: unit-tested on synthetic records)."""
    run = RunLog(label)
    points: dict[str, dict[int, float]] = {}
    checkpoints: dict[int, dict[str, float]] = {}
    attempts: list[dict[str, Any]] = []
    for record in records:
        at = _number(record.get("time"))
        kind = record.get("event")
        if kind == metricslog.EVENT_START:
            attempts.append({"start": record, "started": at, "ended": at, "steps": [], "times": {}, "pre": False})
            run.start = record
        elif kind is not None:
            if kind == metricslog.EVENT_CHECKPOINT and _step(record.get("step")) is not None:
                seconds, size = _number(record.get("seconds")), _number(record.get("bytes"))
                checkpoints[record["step"]] = {
                    "step": float(record["step"]),
                    "seconds": seconds if seconds is not None else math.nan,
                    "bytes": size if size is not None else math.nan,
                }
            elif kind == metricslog.EVENT_DONE:
                run.done = record
            elif kind == metricslog.EVENT_PREFLIGHT:
                run.preflight = run.preflight or record
            elif kind == metricslog.EVENT_PREEMPTED and attempts:
                attempts[-1]["pre"] = True
        step = _step(record.get("step"))
        if kind is None and step is not None:
            if "train_runtime" in record and "loss" not in record:
                run.summary = record
            for key in (*TRAIN_KEYS, *EVAL_KEYS):
                value = _number(record.get(key))
                if value is not None:
                    points.setdefault(key, {})[step] = value  # a replayed step: the later attempt's value wins
            if "loss" in record and attempts:
                attempts[-1]["steps"].append(step)
                if at is not None:
                    attempts[-1]["times"].setdefault(step, at)
        if attempts and at is not None and kind not in _BEFORE_START:
            attempts[-1]["ended"] = at
        if kind in _BASELINE_EVENTS or (kind is None and step is not None):
            run.records.append(record)
    run.series = {key: sorted(values.items()) for key, values in points.items()}
    run.checkpoints = [checkpoints[s] for s in sorted(checkpoints)]
    for number, a in enumerate(attempts):
        steps = a["steps"]
        run.attempts.append(
            Attempt(
                number,
                a["started"],
                a["ended"],
                _step(a["start"].get("resume_step")),
                min(steps) if steps else None,
                max(steps) if steps else None,
                a["pre"],
            )
        )
        if number:
            before = run.attempts[number - 1]
            run.restarts.append(_restart(before, run.attempts[number], a["times"]))
    return run


def _restart(before: Attempt, after: Attempt, times: dict[int, float]) -> Restart:
    downtime = recovery = None
    if before.ended is not None and after.started is not None:
        downtime = max(0.0, after.started - before.ended)
    past = [t for s, t in times.items() if before.last_step is None or s > before.last_step]
    if before.ended is not None and past:
        recovery = max(0.0, min(past) - before.ended)
    return Restart(after.number, before.last_step, after.resume_step, before.preempted, downtime, recovery)


# ------------------------------------------------------------------------------------------- finding the run
def on_volume(path: str, mount: str, volume: Path | None) -> Path:
    """A pod's ``path`` as this machine sees it: below ``volume`` when it lies on the shared volume ``mount``."""
    mount = mount.rstrip("/") or "/"
    if volume is None or not (path == mount or path.startswith(mount + "/")):
        return Path(path)
    return volume / path[len(mount) :].lstrip("/")


def _bundle_info(bundle: Path, run: RunLog) -> Path:
    """Read the bundle's plan, manifest and recipe into ``run``; return the pods' output_dir (not yet mapped)."""
    resolved = _recipe_yaml(bundle)
    plan = _json_file(bundle / "plan.json", runfiles.PLAN_FIELDS)
    run.plan = plan if isinstance(plan, dict) else None
    manifest = _json_file(bundle / "manifest.json", runfiles.MANIFEST_FIELDS)
    if isinstance(manifest, dict):
        run.manifest = {k: v for k, v in manifest.items() if k != "files"}
        digest = (manifest.get("files") or {}).get(filenames.RECIPE_FILE)
        run.recipe_digest = digest if isinstance(digest, str) else None
    if run.recipe_digest is None:
        run.recipe_digest = hashlib.sha256(read_regular(bundle / filenames.RECIPE_FILE, BUNDLE_FILE)).hexdigest()
    image = (resolved.get("plan") or {}).get("image")
    run.image = str(image) if image else None
    output = (resolved.get("training_arguments") or {}).get("output_dir")
    if not output:
        raise RecipeError([Problem(str(bundle / filenames.RECIPE_FILE), "no training_arguments.output_dir")])
    return Path(str(output))


def _relocated(value: Any, prefix: str, name: str) -> Any:
    """``value`` with every string below ``prefix`` written relative to ``name``."""
    if isinstance(value, dict):
        return {k: _relocated(v, prefix, name) for k, v in value.items()}
    if isinstance(value, list):
        return [_relocated(v, prefix, name) for v in value]
    if isinstance(value, str) and (value == prefix or value.startswith(prefix + "/")):
        return name + value[len(prefix) :]
    return value


def _recipe_yaml(bundle: Path) -> dict[str, Any]:
    """The bundle's resolved recipe.yaml, read as recipekit reads any YAML (size, alias and tag checks first)."""
    path = bundle / filenames.RECIPE_FILE
    try:
        resolved = yamlfile.read(path) or {}
    except yaml.YAMLError as exc:
        raise RecipeError([Problem(str(path), yamlfile.one_line(exc))]) from None
    if not isinstance(resolved, dict):
        raise RecipeError([Problem(str(path), "not a mapping")])
    recipe = resolved.get("recipe")
    sections = {key: resolved.get(key) for key in ("recipe", "plan", "training_arguments")}
    sections["recipe.cluster"] = recipe.get("cluster") if isinstance(recipe, dict) else None
    wrong = [key for key, value in sections.items() if value is not None and not isinstance(value, dict)]
    if wrong:  # a bundle edited by hand or by someone else: one line, not an AttributeError
        raise RecipeError(
            [Problem(f"{path}: {wrong[0]}", f"must be a mapping (got {type(sections[wrong[0]]).__name__})")]
        )
    return resolved


def _mount(bundle: Path) -> str:
    resolved = _recipe_yaml(bundle)
    return str(((resolved.get("recipe") or {}).get("cluster") or {}).get("mount_path") or "/")


def load_run(path: Path, volume: Path | None = None, plan: Path | None = None, label: str | None = None) -> RunLog:
    """The run at ``path`` (an output directory, a bundle, a dry run's work directory or a baseline file).

    ``volume``: where the bundle's shared volume is mounted here. ``plan``: a plan.json (or a bundle holding one) to
    hold the run against when ``path`` is a bare output directory.
    """
    path = newest_dry_run(Path(path))
    name = label or str(path)
    if path.is_file():
        run = load_baseline(path, name)
    elif not path.is_dir():
        raise RecipeError([Problem(str(path), "no such run directory, bundle or baseline file" + did_you_mean(path))])
    elif (path / DRYRUN_MARKER).is_file() and (path / "bundle" / filenames.RECIPE_FILE).is_file():
        run = RunLog(name)
        output = _bundle_info(path / "bundle", run)  # the twin's own plan; its output_dir is a local path
        run = _with_output(run, output)
        if run.manifest:  # the work directory's own location is no difference between two dry runs
            run.manifest = _relocated(run.manifest, str(path.resolve()), "<dry-run workdir>")
    elif (path / filenames.RECIPE_FILE).is_file() and (path / "manifest.json").is_file():
        run = RunLog(name)
        output = _bundle_info(path, run)
        run = _with_output(run, on_volume(str(output), _mount(path), volume))
    elif (path / filenames.METRICS_FILE).is_file():
        run = _with_output(RunLog(name), path)
    else:
        raise RecipeError(
            [
                Problem(
                    str(path), f"neither a run's output directory (no {filenames.METRICS_FILE}), a bundle nor a dry run"
                )
            ]
        )
    if plan is not None:
        plan_file = plan / "plan.json" if plan.is_dir() else plan
        data = _json_file(plan_file, runfiles.PLAN_FIELDS)
        if not isinstance(data, dict):
            raise RecipeError([Problem(str(plan_file), "not a readable plan.json")])
        run.plan = data
    return run


def newest_dry_run(path: Path) -> Path:
    """``path``; or, where it is the folder a bundle's dry runs are kept in (``bundles/.dryrun/<bundle>``, one work
    directory per dry run, named by run id and time: validate.dryrun.workdir.kept), the newest of them."""
    if not path.is_dir() or (path / DRYRUN_MARKER).exists():
        return path
    runs = kept_runs(path)
    return runs[-1] if runs else path


def _with_output(run: RunLog, output: Path) -> RunLog:
    metrics = output / filenames.METRICS_FILE
    if not metrics.is_file():
        raise RecipeError(
            [Problem(str(output), f"no {filenames.METRICS_FILE} here (has the run started? is --volume right?)")]
        )
    records, warnings = read_metrics(metrics)
    found = from_records(run.label, records)
    for name in ("plan", "manifest", "recipe_digest", "image"):
        setattr(found, name, getattr(run, name))
    found.output_dir = output
    found.warnings = warnings
    check = _json_file(output / filenames.CLUSTER_CHECK_FILE, runfiles.PREFLIGHT_FIELDS, within=output)
    if isinstance(check, dict):
        found.preflight = check
    record = _json_file(output / filenames.RUN_FILE, within=output)
    found.run_record = record if isinstance(record, dict) else None
    return found


# --------------------------------------------------------------------------------------------------- baselines
def baseline(run: RunLog) -> dict[str, Any]:
    """A run as a small JSON document: its numeric records, plan, manifest and preflight, for ``--baseline``."""
    return {
        "format": BASELINE_FORMAT,
        "label": run.label,
        "records": run.records,
        "plan": run.plan,
        "manifest": run.manifest,
        "recipe_digest": run.recipe_digest,
        "image": run.image,
        "preflight": run.preflight,
        "run_record": run.run_record,
    }


def load_baseline(path: Path, label: str | None = None) -> RunLog:
    """A baseline file written by :func:`baseline` (``recipekit report --export-baseline``)."""
    data = _json_file(path)
    if not isinstance(data, dict) or data.get("format") != BASELINE_FORMAT:
        raise RecipeError([Problem(str(path), f'not a baseline file (no "format": "{BASELINE_FORMAT}")')])
    typed = {
        **{f"plan.{k}": v for k, v in runfiles.PLAN_FIELDS.items()},
        **{f"preflight.{k}": v for k, v in runfiles.PREFLIGHT_FIELDS.items()},
        "records": runfiles.LIST,
    }
    problems = runfiles.type_problems(data, typed, str(path))
    if problems:
        raise RecipeError(problems)
    records = [r for r in data.get("records") or [] if runfiles.record_problem(r, metricslog.EVENT_START) is None]
    run = from_records(label or str(path), records)
    for name in ("plan", "manifest", "preflight", "run_record"):
        value = data.get(name)
        setattr(run, name, value if isinstance(value, dict) else getattr(run, name))
    for name in ("recipe_digest", "image"):
        value = data.get(name)
        setattr(run, name, value if isinstance(value, str) else None)
    return run
