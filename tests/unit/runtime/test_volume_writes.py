"""Issue 38: every write of a run to the shared volume refuses what someone else planted there.

Anyone who can write to the PVC can put a symlink, a hard link, a FIFO or a file of their own where a run is about to
write. Each writer of the runtime is driven here into a directory holding such a name: the file a link points to
is never changed, a FIFO never blocks the writer, a hard-linked or foreign file is not appended to, and a directory
that is a link (or someone else's) is not written into. The dry run's work-directory cleanup is held to the same
rule: a link planted at ``pods/pod-0`` is never chmodded through.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from recipekit.runtime.boundary import exitcodes, filenames, metricslog
from recipekit.runtime.boundary.resume import resumechoice
from recipekit.runtime.ops import faults, preflight
from recipekit.runtime.volume import attemptends, manifest, recovery, resume, rowledger

OTHER_USER = 54321


def end_of_rank_3(output: Path) -> None:
    attemptends.watch(output)
    attemptends.record_end(exitcodes.EXIT_FAILED, {"RANK": "3", "GROUP_RANK": "1"})


def metrics_line(output: Path) -> None:
    metricslog.append_record(output / filenames.METRICS_FILE, {"step": 1})


def progress(output: Path) -> None:
    recovery.RecoveryLog(output, enabled=True, clock=lambda: 1.0, environ={}).step(1)


def ledger_line(output: Path) -> None:
    rowledger.RowLedger(output, rank=0, world_size=1).record(1, [0, 1])


def run_record(output: Path) -> None:
    resumechoice.write_run_record(output / "checkpoint-4", {"run_id": "r", "step": 4})


def resumed_mark(output: Path) -> None:
    resume.mark_resumed(output, "r", 4, b"k" * 32)


def exit_record(output: Path) -> None:
    exitcodes.record_exit(exitcodes.EXIT_FAILED, {exitcodes.EXIT_DIR_ENV: str(output / "exit"), "RANK": "0"})


def prepared_manifest(output: Path) -> None:
    manifest.write_atomic(output / "prepared" / "manifest.json", b"{}")


def preflight_marker(output: Path) -> None:
    preflight.storage_write(output, 0, "tok")


def fault_marker(output: Path) -> None:
    injected = faults.Faults.__new__(faults.Faults)
    injected.dir, injected.rank = output / "faults", 0
    injected._mark("nan", 3)


#: Each writer and the path it writes (relative to the run's output directory).
WRITERS: dict[str, tuple[Callable[[Path], None], str]] = {
    "attempt end": (end_of_rank_3, f"{attemptends.ENDS_DIR}/rank-3.jsonl"),
    "metrics.jsonl": (metrics_line, filenames.METRICS_FILE),
    "progress": (progress, recovery.PROGRESS_FILE),
    "row ledger": (ledger_line, f"{rowledger.LEDGER_DIR}/rank-0.jsonl"),
    "run record": (run_record, f"checkpoint-4/{filenames.RUN_FILE}"),
    "resumed mark": (resumed_mark, resume.MARK_FILE),
    "exit code": (exit_record, "exit/rank-0.json"),
    "prepared manifest": (prepared_manifest, "prepared/manifest.json"),
    "preflight marker": (preflight_marker, f"{filenames.PREFLIGHT_DIR}/pod-0.tok"),
    "fault marker": (fault_marker, "faults/nan-at-step-3"),
}


def _write_quietly(write: Callable[[Path], None], output: Path) -> None:
    """Run a writer: those that must never stop training swallow the refusal; the others raise OSError."""
    try:
        write(output)
    except OSError:
        pass


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_planted_symlink_is_never_written_through(tmp_path: Path, name: str) -> None:
    write, relative = WRITERS[name]
    output, victim = tmp_path / "run", tmp_path / "victim.txt"
    victim.write_text("the pod user's own file\n")
    planted = output / relative
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.symlink_to(victim)
    _write_quietly(write, output)
    assert victim.read_text() == "the pod user's own file\n", "written through the link"
    if planted.is_symlink():  # appenders leave the link untouched; a replacement replaced the name, not the target
        assert os.readlink(planted) == str(victim)
    else:
        assert stat.S_ISREG(os.lstat(planted).st_mode)


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_directory_that_is_a_link_is_not_written_into(tmp_path: Path, name: str) -> None:
    write, relative = WRITERS[name]
    output, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    parent = output / Path(relative).parent
    if parent == output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.symlink_to(elsewhere)
        pytest.skip("the output directory itself is the recipe's (cluster.output_dir): trusted")
    parent.parent.mkdir(parents=True, exist_ok=True)
    parent.symlink_to(elsewhere)
    _write_quietly(write, output)
    assert list(elsewhere.iterdir()) == [], "written into the linked directory"


@pytest.mark.parametrize("name", ["attempt end", "metrics.jsonl", "row ledger"])
def test_appenders_refuse_a_fifo_a_hard_link_and_someone_elses_file(tmp_path: Path, name: str) -> None:
    write, relative = WRITERS[name]
    output = tmp_path / "run"
    planted = output / relative
    planted.parent.mkdir(parents=True, exist_ok=True)

    os.mkfifo(planted)  # a writer that opened it would block until a reader came
    done = threading.Event()
    thread = threading.Thread(target=lambda: (_write_quietly(write, output), done.set()), daemon=True)
    thread.start()
    assert done.wait(10), "the writer blocked on a FIFO"
    planted.unlink()

    other = tmp_path / "other-file"
    other.write_text("x\n")
    os.link(other, planted)
    _write_quietly(write, output)
    assert other.read_text() == "x\n", "appended to a hard link"
    planted.unlink()

    if os.geteuid() == 0:  # only root can make a file another user's here
        planted.write_text("theirs\n")
        os.chown(planted, OTHER_USER, OTHER_USER)
        _write_quietly(write, output)
        assert planted.read_text() == "theirs\n", "appended to another user's file"


def test_a_directory_another_user_owns_is_not_written_into(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can make a directory another user's here")
    ends = tmp_path / "run" / attemptends.ENDS_DIR
    ends.mkdir(parents=True)
    os.chown(ends, OTHER_USER, OTHER_USER)
    end_of_rank_3(tmp_path / "run")
    assert list(ends.iterdir()) == []
    from recipekit.runtime.boundary import jsonfile

    with pytest.raises(OSError, match="owned by user 54321"):
        jsonfile.append(ends / "x.jsonl", b"x\n")


def test_the_writers_still_write_where_nothing_was_planted(tmp_path: Path) -> None:
    output = tmp_path / "run"
    for name, (write, relative) in sorted(WRITERS.items()):
        write(output)
        assert stat.S_ISREG(os.lstat(output / relative).st_mode), name
    end_of_rank_3(output)  # appended: two lines now
    lines = (output / attemptends.ENDS_DIR / "rank-3.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["rank"] == 3
    assert attemptends.read_ends(output)[0]["code"] == exitcodes.EXIT_FAILED
    assert not [p for p in output.rglob("*.tmp-*")], "no staging file left"


# ------------------------------------------------------------------------------------- the dry run's work directory
def test_a_link_planted_at_a_pod_is_never_chmodded_through(tmp_path: Path) -> None:
    """A used work directory with ``pods/pod-0`` replaced by a link to a private directory: the cleanup makes the
    pods' own read-only mounts writable again and nothing the link points to."""
    from recipekit.validate.dryrun.workdir import podmount

    root = tmp_path / "work"
    private = tmp_path / "private"
    (private / "run").mkdir(parents=True)
    private.chmod(0o700)
    (private / "run").chmod(0o700)
    (root / "pods").mkdir(parents=True)
    (root / "pods" / "pod-0").symlink_to(private, target_is_directory=True)
    (root / "pods" / "pod-1" / "run").mkdir(parents=True)
    (root / "pods" / "pod-1" / "run").chmod(0o555)  # the dry run's own read-only mount
    (root / "pods" / "pod-2").mkdir()
    (root / "pods" / "pod-2" / "run").symlink_to(private / "run", target_is_directory=True)
    podmount.unmount(root)
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(private / "run").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(root / "pods" / "pod-1" / "run").st_mode) == 0o755
    with pytest.raises(OSError, match="is a link"):
        podmount.mount(tmp_path / "bundle", root, 0)
    assert stat.S_IMODE(os.stat(private / "run").st_mode) == 0o700
