"""The signed run record (runtime/volume/trust.py): what proves a checkpoint or prepared data was written by this run.

Someone who can write to the shared volume but cannot read the run key must not be able to make a directory that
verifies: not by leaving the record out, not by editing it, not by changing, adding or swapping a file under it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from recipekit.runtime.boundary import filenames
from recipekit.runtime.boundary.resume import resumechoice
from recipekit.runtime.volume import trust

KEY = b"k" * 32
EXCLUDED = frozenset({filenames.RUN_FILE})


def signed_checkpoint(root: Path, key: bytes = KEY) -> Path:
    path = root / "checkpoint-4"
    (path / "global_step4").mkdir(parents=True)
    (path / "trainer_state.json").write_text('{"global_step": 4}')
    (path / "global_step4" / "mp_rank_00_model_states.pt").write_bytes(b"\x80\x04weights")
    record = trust.sign({"run_id": "r1", "step": 4}, key, trust.digests(path, EXCLUDED))
    resumechoice.write_run_record(path, record)
    return path


def verify(path: Path, key: bytes = KEY) -> None:
    trust.verify_directory(path, resumechoice.read_run_record(path), key, EXCLUDED, path.name)


def test_a_signed_directory_verifies_and_lists_every_file(tmp_path: Path) -> None:
    path = signed_checkpoint(tmp_path)
    verify(path)
    record = resumechoice.read_run_record(path)
    assert sorted(record["files"]) == ["global_step4/mp_rank_00_model_states.pt", "trainer_state.json"]
    assert len(record["hmac"]) == 64


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda p: (p / filenames.RUN_FILE).unlink(), "no signed record"),
        (lambda p: _edit_record(p, step=5), "signature does not verify"),
        (lambda p: _edit_record(p, hmac="0" * 64), "signature does not verify"),
        (lambda p: (p / "trainer_state.json").write_text('{"global_step": 5}'), "trainer_state.json was changed"),
        (lambda p: (p / "global_step4" / "extra.pt").write_bytes(b"x"), "extra.pt is not in its signed record"),
        (lambda p: (p / "trainer_state.json").unlink(), "trainer_state.json is missing"),
        (lambda p: _swap_for_symlink(p / "trainer_state.json"), "is a symlink"),
        (lambda p: _swap_for_fifo(p / "trainer_state.json"), "not a regular file"),
    ],
    ids=["no-record", "edited-field", "forged-hmac", "changed-file", "extra-file", "missing", "symlink", "fifo"],
)
def test_every_tampering_is_refused(tmp_path: Path, tamper, message: str) -> None:
    path = signed_checkpoint(tmp_path)
    tamper(path)
    with pytest.raises(trust.Untrusted, match=message):
        verify(path)


def test_a_record_with_updated_digests_but_no_key_does_not_verify(tmp_path: Path) -> None:
    """The attacker's best move: rewrite a file, put its new sha256 in the record, sign with a guessed key."""
    path = signed_checkpoint(tmp_path)
    (path / "trainer_state.json").write_text('{"global_step": 99}')
    forged = trust.sign({"run_id": "r1", "step": 4}, b"g" * 32, trust.digests(path, EXCLUDED))
    resumechoice.write_run_record(path, forged)
    with pytest.raises(trust.Untrusted, match="signature does not verify"):
        verify(path)
    verify(path, b"g" * 32)  # the guessed key signs for itself only


def test_the_key_comes_from_the_file_the_env_names(tmp_path: Path) -> None:
    assert trust.load_key({}) is None
    key = tmp_path / "key"
    key.write_text("s" * 40 + "\n")
    assert trust.load_key({trust.KEY_ENV: str(key)}) == b"s" * 40
    key.write_text("short")
    with pytest.raises(trust.Untrusted, match="fewer than 16"):
        trust.load_key({trust.KEY_ENV: str(key)})
    with pytest.raises(trust.Untrusted, match="cannot read the run key"):
        trust.load_key({trust.KEY_ENV: str(tmp_path / "absent")})
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(trust.Untrusted, match="not a regular file"):
        trust.load_key({trust.KEY_ENV: str(fifo)})


def test_train_refuses_before_parsing_and_says_so_in_one_line(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("transformers")
    from recipekit.runtime.boundary.common import RunError
    from recipekit.runtime.session import checkpoints

    path = signed_checkpoint(tmp_path)
    monkeypatch.delenv(trust.KEY_ENV, raising=False)
    with pytest.raises(RunError, match="no run key"):
        checkpoints.verify_checkpoint(path)
    key = tmp_path / "key"
    key.write_bytes(KEY)
    monkeypatch.setenv(trust.KEY_ENV, str(key))
    checkpoints.verify_checkpoint(path)
    (path / "global_step4" / "mp_rank_00_model_states.pt").write_bytes(b"\x80\x04evil")
    with pytest.raises(RunError, match="refusing to resume: checkpoint-4: global_step4/mp_rank_00_model_states.pt"):
        checkpoints.verify_checkpoint(path)


def _edit_record(path: Path, **changes: object) -> None:
    record = json.loads((path / filenames.RUN_FILE).read_text())
    record.update(changes)
    (path / filenames.RUN_FILE).write_text(json.dumps(record))


def _swap_for_symlink(file: Path) -> None:
    """The same bytes, outside the checkpoint, behind a symlink (a later write there would change what loads)."""
    outside = file.parent.parent / "outside.json"
    file.rename(outside)
    file.symlink_to(outside)


def _swap_for_fifo(file: Path) -> None:
    file.unlink()
    os.mkfifo(file)


def test_validate_says_what_is_trusted_and_fails_a_job_without_the_run_key(tmp_path: Path) -> None:
    import yaml

    from recipekit.bundle.build import build
    from recipekit.validate.shared.loader import load_bundle
    from recipekit.validate.shared.results import Status
    from recipekit.validate.static.trust import check_trust

    bundle = build(["recipe=tiny_sft"], tmp_path / "b", force=True).path
    passed = check_trust(load_bundle(bundle))
    assert passed.status is Status.PASS and "still trusted: the image, the bundle" in passed.reason
    job = yaml.safe_load((bundle / "volcano-job.yaml").read_text())
    for container in job["spec"]["tasks"][0]["template"]["spec"]["containers"]:
        container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "run-key"]
    (bundle / "volcano-job.yaml").write_text(yaml.safe_dump(job))
    failed = check_trust(load_bundle(bundle))
    assert failed.status is Status.FAIL and "not mounted at /etc/recipekit/run-key" in str(failed.findings[0])
