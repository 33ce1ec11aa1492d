"""Log keywords counted per rank (runtime/ops/logevents.py): which lines name which fault, the handler on the root
logger that also reads a logged exception's text, and the run-directory file that carries the counts over a restart."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from recipekit.runtime.boundary import metricnames as names
from recipekit.runtime.ops import logevents


class Recorder:
    """An exporter that remembers what it was given."""

    def __init__(self) -> None:
        self.counts: dict[str, float] = {}
        self.times: dict[str, float] = {}

    def inc(self, metric: names.Metric, label: str = "", amount: float = 1.0) -> None:
        self.counts[label] = self.counts.get(label, 0) + amount

    def set(self, metric: names.Metric, value: float, label: str = "") -> None:
        self.times[label] = value


def test_each_kind_is_named_by_its_keywords_and_nothing_else() -> None:
    assert logevents.classify("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)") == [
        "collective_timeout"
    ]
    assert logevents.classify("HCCL execute timed out after 1836 s") == ["collective_timeout"]
    assert logevents.classify("EI0002: The wait execution of the Notify register times out.") == ["collective_timeout"]
    assert logevents.classify("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus") == ["device_ecc"]
    assert logevents.classify("uncorrectable ECC error encountered") == ["device_ecc"]
    assert logevents.classify("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate") == ["device_oom"]
    for quiet in ("loss 2.31 at step 7", "NCCL_DEBUG=INFO", "the timeout is 1800 s", "checkpoint saved", "eccentric"):
        assert logevents.classify(quiet) == [], quiet


def test_the_handler_counts_a_logged_exception_and_the_restart_serves_it_again(tmp_path: Path) -> None:
    first = Recorder()
    handler = logevents.install(tmp_path, 2)
    handler.events.attach(first)
    try:
        try:
            raise RuntimeError("HCCL function error: EI0006 socket timed out")
        except RuntimeError:
            logging.getLogger("train").exception("training failed")
        logging.getLogger("train").info("out of memory")  # below WARNING: not counted
    finally:
        logging.getLogger().removeHandler(handler)
    assert first.counts == {"collective_timeout": 1}
    saved = json.loads((tmp_path / logevents.DIR / "rank-2.json").read_text())
    assert saved["collective_timeout"]["count"] == 1
    again = Recorder()
    logevents.LogEvents(tmp_path, 2, again)  # the restarted process of rank 2
    assert again.counts == {"collective_timeout": 1} and again.times == first.times


def test_a_malformed_counts_file_counts_as_nothing(tmp_path: Path) -> None:
    (tmp_path / logevents.DIR).mkdir()
    for junk in ('{"device_oom": {"count": "9", "time": 1}}', "[1, 2]", "{", '{"other": {"count": 1, "time": 1}}'):
        (tmp_path / logevents.DIR / "rank-0.json").write_text(junk)
        events = logevents.LogEvents(tmp_path, 0, Recorder())
        assert events.counts == {}, junk
