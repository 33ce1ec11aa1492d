"""benchmarks/slowvolume.py, the checkpoint benchmark's slow shared volume: the link it models is shared fairly by
the writes in flight (a metrics record is not queued behind a checkpoint's megabytes), and where FUSE is here the
mount passes everything through, holding only the shared volume's writes to the bandwidth."""

from __future__ import annotations

import importlib.util
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.scriptmodule import script_module

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "slowvolume.py"


@pytest.fixture(scope="module")
def slowvolume():
    with script_module(SCRIPT) as module:
        yield module


def test_one_writer_has_the_link_and_two_share_it(slowvolume, monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(slowvolume.time, "sleep", slept.append)
    link = slowvolume.Bandwidth(1e6)
    assert link.take(500_000) == 0.5 and slept == [0.5]
    link.writers = 1  # another write in flight
    assert link.take(500_000) == 1.0  # half the link: twice the time
    assert link.writers == 1  # its own write is done


def test_writers_in_flight_are_counted_while_they_sleep(slowvolume) -> None:
    link = slowvolume.Bandwidth(1e6)
    bulk = threading.Thread(target=link.take, args=(200_000,))  # 0.2 s alone
    bulk.start()
    time.sleep(0.05)
    assert link.writers == 1
    assert link.take(1000) == pytest.approx(0.002)  # a small record shares the link, it does not queue behind
    bulk.join()
    assert link.writers == 0


@pytest.mark.skipif(
    not (os.path.exists("/dev/fuse") and shutil.which("fusermount3") and importlib.util.find_spec("mfusepy")),
    reason="no FUSE here (/dev/fuse, Debian's fuse3, pip install mfusepy)",
)
def test_the_mount_passes_through_and_holds_the_shared_volume_s_writes(slowvolume, tmp_path: Path) -> None:
    data = os.urandom(1_000_000)
    try:
        mounted = slowvolume.slow_volume(tmp_path / "backing", tmp_path / "mount", 4.0)
        mount = mounted.__enter__()
    except SystemExit as exc:  # /dev/fuse present but unusable (a container without the capability)
        pytest.skip(str(exc))
    try:
        (mount / "shared").mkdir()
        (mount / "hot").mkdir()
        start = time.monotonic()
        (mount / "hot" / "node.bin").write_bytes(data)
        local = time.monotonic() - start
        start = time.monotonic()
        (mount / "shared" / "volume.bin").write_bytes(data)
        shared = time.monotonic() - start
        assert (mount / "shared" / "volume.bin").read_bytes() == data
    finally:
        mounted.__exit__(None, None, None)
    assert shared >= 0.25 > local  # 1 MB at 4 MB/s
    assert (tmp_path / "backing" / "shared" / "volume.bin").read_bytes() == data  # passed through
    assert not os.path.ismount(tmp_path / "mount")
