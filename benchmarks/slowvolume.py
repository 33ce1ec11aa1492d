"""A slow shared volume for the checkpoint benchmark: a FUSE pass-through of a local directory whose writes below one
sub-directory are held to a bandwidth, as a network volume's are.

The dry run keeps its shared volume (``<workdir>/shared``) and the pods' node-local disks (``<workdir>/hot``) in one
work directory on the same local disk, so a checkpoint costs the step the same on either and the hot tier cannot
show what it takes off the step. Mounted over the work directory, this file system passes everything through to a
backing directory and makes each ``write`` below ``/shared`` wait for its share of ``mbps`` (the writes in flight
share the one link fairly, :class:`Bandwidth`), so the shared volume is as slow as asked and the node-local disk is
not. Reads, metadata and every other path are passed through at local speed.

Needs FUSE (``/dev/fuse``, Debian's ``fuse3``) and ``mfusepy`` from PyPI; run as a child process by
``bench_checkpoint.py --volume-mbps`` (``python benchmarks/slowvolume.py BACKING MOUNT MBPS``, in the foreground,
until it is unmounted with ``fusermount3 -u MOUNT``).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: The sub-directory of the mount whose writes are slow: the dry run's shared volume.
SLOW_PREFIX = "/shared/"


class Bandwidth:
    """A link of ``bytes_per_s`` shared fairly by the writes in flight: a write of ``size`` bytes takes
    ``size × writers / rate`` (a small metrics record is not queued behind a checkpoint's megabytes, as it would be
    on one first-come line, nor given the link to itself while a checkpoint streams)."""

    def __init__(self, bytes_per_s: float) -> None:
        self.rate = bytes_per_s
        self.lock = threading.Lock()
        self.writers = 0

    def take(self, size: int) -> float:
        """Sleep for ``size`` bytes' share of the link; the seconds slept."""
        with self.lock:
            self.writers += 1
            wait = size * self.writers / self.rate
        try:
            time.sleep(wait)
        finally:
            with self.lock:
                self.writers -= 1
        return wait


def _operations(backing: Path, bandwidth: Bandwidth) -> Any:
    from mfusepy import FuseOSError, Operations

    class Throttled(Operations):  # type: ignore[misc]
        """Every call on ``path`` made on ``backing + path`` (an OSError is its errno to the caller, mfusepy's
        rule); writes below :data:`SLOW_PREFIX` wait for the link."""

        use_ns = True

        def _real(self, path: str) -> str:
            return str(backing) + path

        def access(self, path: str, amode: int) -> int:
            if not os.access(self._real(path), amode):
                raise FuseOSError(errno.EACCES)
            return 0

        def chmod(self, path: str, mode: int) -> int:
            os.chmod(self._real(path), mode)
            return 0

        def chown(self, path: str, uid: int, gid: int) -> int:
            os.chown(self._real(path), uid, gid)
            return 0

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            return os.open(self._real(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

        def flush(self, path: str, fh: int) -> int:
            return 0

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            os.fsync(fh)
            return 0

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            st = os.lstat(self._real(path))  # times in nanoseconds (use_ns)
            keys = ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_atime_ns", "st_mtime_ns", "st_ctime_ns")
            return {key.removesuffix("_ns"): getattr(st, key) for key in keys}

        def link(self, target: str, source: str) -> int:
            os.link(self._real(source), self._real(target))
            return 0

        def mkdir(self, path: str, mode: int) -> int:
            os.mkdir(self._real(path), mode)
            return 0

        def open(self, path: str, flags: int) -> int:
            return os.open(self._real(path), flags)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            return os.pread(fh, size, offset)

        def readdir(self, path: str, fh: int) -> Iterator[str]:
            yield from (".", "..", *os.listdir(self._real(path)))

        def readlink(self, path: str) -> str:
            return os.readlink(self._real(path))

        def release(self, path: str, fh: int) -> int:
            os.close(fh)
            return 0

        def rename(self, old: str, new: str) -> int:
            os.rename(self._real(old), self._real(new))
            return 0

        def rmdir(self, path: str) -> int:
            os.rmdir(self._real(path))
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            st = os.statvfs(self._real(path))
            keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_frsize")
            return {key: getattr(st, key) for key in keys} | {"f_namemax": st.f_namemax}

        def symlink(self, target: str, source: str) -> int:
            os.symlink(source, self._real(target))
            return 0

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            os.truncate(fh if fh is not None else self._real(path), length)
            return 0

        def unlink(self, path: str) -> int:
            os.unlink(self._real(path))
            return 0

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            os.utime(self._real(path), ns=times, follow_symlinks=False) if times else os.utime(self._real(path))
            return 0

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            if path.startswith(SLOW_PREFIX):
                bandwidth.take(len(data))
            return os.pwrite(fh, data, offset)

    return Throttled()


def serve(backing: Path, mount: Path, mbps: float) -> None:
    """Mount and serve until unmounted (foreground, threaded)."""
    from mfusepy import FUSE

    FUSE(_operations(backing, Bandwidth(mbps * 1e6)), str(mount), foreground=True, default_permissions=True)


@contextmanager
def slow_volume(backing: Path, mount: Path, mbps: float) -> Iterator[Path]:
    """``mount`` serving ``backing``, its ``shared/`` writes at ``mbps`` MB/s, for the ``with`` block."""
    backing.mkdir(parents=True, exist_ok=True)
    mount.mkdir(parents=True, exist_ok=True)
    server = subprocess.Popen([sys.executable, __file__, str(backing), str(mount), str(mbps)])
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mount):
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the slow volume did not mount at {mount} (FUSE: /dev/fuse, fuse3, mfusepy)")
            time.sleep(0.1)
        yield mount
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mount)], check=False)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    serve(Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]))
