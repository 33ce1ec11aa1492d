"""Issue 41, item 7: each dry run keeps its own work directory and report, named by run id and time, until
`recipekit clean` or the retention count removes it; one run id from bundle to dry run to report; failures in words.
(The dry run itself, keeping an older one and carrying the bundle's run id: tests/integration/test_dryrun.py.)"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from recipekit.bundle.build import build, resolve
from recipekit.cli import main
from recipekit.cli.validate import traceback_once
from recipekit.validate.dryrun.cluster.attemptlog import exits_in_words
from recipekit.validate.dryrun.workdir import kept
from recipekit.validate.dryrun.workdir.locks import claim_workdir
from recipekit.validate.dryrun.workdir.workcopy import same_run


def _old_run(folder: Path, name: str) -> Path:
    root = folder / name
    (root / "logs").mkdir(parents=True)
    (root / kept.MARKER).write_text("")
    (root / "logs" / "pod-0.log").write_text("x" * 1000)
    return root


def test_a_dry_run_gets_a_work_directory_of_its_own(tmp_path: Path) -> None:
    bundle = tmp_path / "bundles" / "tiny_sft"
    first = kept.new_workdir(bundle, "abc123", now=0)
    assert first == (tmp_path / "bundles" / ".dryrun" / "tiny_sft" / "abc123-19700101-000000").resolve()
    first.mkdir(parents=True)
    assert kept.new_workdir(bundle, "abc123", now=0).name == "abc123-19700101-000000-2"  # same second: its own


def test_the_newest_are_kept_and_a_running_one_is_never_removed(tmp_path: Path) -> None:
    names = [f"abc123-2025010{day}-120000" for day in range(1, 8)]
    runs = [_old_run(tmp_path, name) for name in names]
    running = claim_workdir(runs[0], kept.MARKER)  # the oldest is still held by its pods
    try:
        cleaned = kept.prune(tmp_path, keep=3)
    finally:
        running.close()
    assert cleaned.busy == [runs[0]] and cleaned.removed == runs[1:4] and cleaned.bytes_freed == 3000
    assert sorted(p.name for p in tmp_path.iterdir()) == [names[0], *names[4:]]


def test_clean_removes_the_kept_dry_runs_and_reports(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "bundles" / ".dryrun" / "tiny_sft"
    for day in (1, 2, 3):
        _old_run(folder, f"abc123-2025010{day}-120000")
    (tmp_path / "recipekit-report" / "abc123-20250101-120000").mkdir(parents=True)
    result = CliRunner().invoke(main, ["clean", "bundles/tiny_sft", "--keep", "1"])
    assert result.exit_code == 0 and "removed 2 dry run(s) of tiny_sft" in result.output, result.output
    assert [p.name for p in folder.iterdir()] == ["abc123-20250103-120000"]
    assert (tmp_path / "recipekit-report").is_dir()  # a bundle named: its dry runs only
    everything = CliRunner().invoke(main, ["clean"])
    assert everything.exit_code == 0, everything.output
    assert list(folder.iterdir()) == [] and list((tmp_path / "recipekit-report").iterdir()) == []


def test_the_work_copy_is_the_bundle_s_run() -> None:
    """The twin's recipe plans to another run id; the work copy keeps the bundle's, and the names made of it."""
    plan = resolve(["recipe=tiny_sft"]).plan
    pinned = same_run(plan, "feed01")
    assert pinned.run_id == "feed01" and pinned.job_name.endswith("-feed01") and plan.job_name != pinned.job_name
    assert pinned.output_dir == plan.output_dir.removesuffix(plan.job_name) + pinned.job_name
    assert same_run(plan, "") is plan


def test_each_report_keeps_its_own_directory_named_by_the_run(tmp_path: Path, monkeypatch) -> None:
    from tests.integration.test_help_examples import _finished_run

    monkeypatch.chdir(tmp_path)
    _finished_run(tmp_path / "run")
    for _ in range(2):
        result = CliRunner().invoke(main, ["report", "run"])
        assert result.exit_code == 0, result.output
    reports = sorted(p.name for p in (tmp_path / "recipekit-report").iterdir())
    assert len(reports) == 2 and all(name.startswith("abc123-") for name in reports), reports


def test_a_failure_is_said_in_words() -> None:
    assert exits_in_words({0: 1, 1: -15}) == "pod 0 exited 1 (failed), pod 1 was stopped by signal 15 (SIGTERM)"
    assert exits_in_words({0: 0, 1: 2}, failed_only=True) == "pod 1 exited 2 (user_error)"


def test_a_traceback_every_rank_printed_is_shown_once() -> None:
    trace = "Traceback (most recent call last):\n  File 'train.py'\nValueError: bad"
    seen: set[str] = set()
    assert traceback_once(f"pod 0 log\n{trace}", seen) == f"pod 0 log\n{trace}"
    ranked = "\n".join(f"[rank1]: {line}" for line in trace.splitlines())
    assert traceback_once(f"pod 1 log\n{ranked}\nexit", seen) == "pod 1 log\n(the same traceback as above)\nexit"


def test_a_bundle_s_run_id_is_in_its_recipe(tmp_path: Path) -> None:
    from recipekit.validate.dryrun.workdir.workcopy import bundle_run_id
    from recipekit.validate.shared.loader import load_bundle

    built = build(["recipe=tiny_sft"], tmp_path / "b")
    assert bundle_run_id(load_bundle(built.path)) == built.resolved.plan.run_id
