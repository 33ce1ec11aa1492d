"""Replacing a bundle: atomic for readers, safe against interruption, and never over a directory that is not a bundle.

See :mod:`recipekit.bundle.write` for what each path guarantees; these tests hold it to them.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from recipekit.base.errors import RecipeError
from recipekit.bundle import write as bundle
from recipekit.bundle.build import compile_bundle, resolve
from recipekit.bundle.files import MANIFEST, REQUIRED
from recipekit.bundle.write import is_bundle, manifest_problem, write_bundle


@pytest.fixture(scope="module")
def versions() -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Two bundles with the same file names and different contents (a reader cannot mistake one for the other)."""
    first = compile_bundle(resolve(["recipe=tiny_sft", "train.seed=1"])).files
    second = compile_bundle(resolve(["recipe=tiny_sft", "train.seed=2"])).files
    assert set(first) == set(second) and first[MANIFEST] != second[MANIFEST]
    return first, second


def contents(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def whole(path: Path) -> str | None:
    """Why ``path`` is not a whole bundle (None when it is): a valid manifest, and every file it lists, intact."""
    problem = manifest_problem(path)
    if problem is not None:
        return problem
    manifest = json.loads((path / MANIFEST).read_text())
    for name, digest in manifest["files"].items():
        try:
            data = (path / name).read_bytes()
        except OSError as exc:
            return f"{name}: {exc.strerror}"
        if hashlib.sha256(data).hexdigest() != digest:
            return f"{name}: hash differs from the manifest"
    return None


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".recipekit-" in p.name)


# ------------------------------------------------------------------------------------------------- readers
READER = textwrap.dedent(
    """
    import json, os, sys
    target, stop, required = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    polls = broken = 0
    first_broken = ""
    while not os.path.exists(stop):
        polls += 1
        try:
            # each path looked up on its own, as a person, a script or `kubectl apply -f` does
            with open(os.path.join(target, "manifest.json"), "rb") as handle:
                manifest = json.loads(handle.read())
            assert isinstance(manifest, dict) and isinstance(manifest.get("files"), dict), "not a manifest"
            for name in [*manifest["files"], *required]:
                os.stat(os.path.join(target, name))
        except (OSError, ValueError, AssertionError) as exc:
            broken += 1
            first_broken = first_broken or repr(exc)
    print(json.dumps({"polls": polls, "broken": broken, "first": first_broken}))
    """
)


def test_a_reader_polling_during_rebuilds_always_sees_a_whole_bundle(versions, tmp_path: Path) -> None:
    """30 replacements while another process looks the bundle's files up as fast as it can: never a missing one.

    (Each lookup is atomic. A reader that holds the *old* directory open across the swap — a walk in progress — may
    see its entries vanish as the old tree is deleted: see recipekit.bundle.write.)"""
    target, stop = tmp_path / "bundle", tmp_path / "stop"
    write_bundle(versions[0], target)
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(target), str(stop), ",".join(REQUIRED)], stdout=subprocess.PIPE, text=True
    )
    try:
        time.sleep(0.3)  # the reader is polling before the first swap
        for index in range(30):
            write_bundle(versions[(index + 1) % 2], target)
            time.sleep(0.005)
    finally:
        stop.touch()
        out, _ = reader.communicate(timeout=60)
    result = json.loads(out)
    assert result["polls"] > 100, result
    assert result["broken"] == 0, result
    assert whole(target) is None and contents(target) == versions[0]
    assert leftovers(tmp_path) == []


def test_the_exchange_keeps_the_path_a_directory_throughout(versions, tmp_path: Path) -> None:
    """On Linux the target is swapped, not removed and re-created: a handle on the old tree stays valid."""
    if not sys.platform.startswith("linux"):
        pytest.skip("renameat2 is Linux's")
    target = tmp_path / "bundle"
    write_bundle(versions[0], target)
    calls: list[str] = []
    original = bundle._exchange

    def spy(first: Path, second: Path) -> None:
        calls.append("exchange")
        original(first, second)

    bundle._exchange = spy  # type: ignore[assignment]
    try:
        write_bundle(versions[1], target)
    finally:
        bundle._exchange = original  # type: ignore[assignment]
    assert calls == ["exchange"] and contents(target) == versions[1]


# --------------------------------------------------------------------------------------------- interruptions
class Interrupted(BaseException):
    """Stands for Ctrl-C or a crash at a chosen step."""


@pytest.mark.parametrize("step", ["while writing", "before the exchange", "between the fallback's renames"])
def test_an_interrupted_replace_keeps_the_old_bundle(versions, tmp_path: Path, monkeypatch, step: str) -> None:
    target = tmp_path / "bundle"
    write_bundle(versions[0], target)
    before = contents(target)
    if step == "while writing":
        real_write = bundle._write_tree

        def half(staging: Path, files: dict[str, bytes]) -> None:
            real_write(staging, dict(list(files.items())[: len(files) // 2]))
            raise Interrupted

        monkeypatch.setattr(bundle, "_write_tree", half)
    elif step == "before the exchange":
        monkeypatch.setattr(bundle, "_exchange", lambda a, b: (_ for _ in ()).throw(Interrupted()))
    else:
        monkeypatch.setattr(bundle, "_exchange", lambda a, b: (_ for _ in ()).throw(bundle._ExchangeUnsupported()))
        real_rename = os.rename
        seen: list[str] = []

        def rename(src, dst):
            seen.append(str(dst))
            if len(seen) == 2:  # the new bundle into place: interrupted
                raise Interrupted
            return real_rename(src, dst)

        monkeypatch.setattr(bundle.os, "rename", rename)
    with pytest.raises(Interrupted):
        write_bundle(versions[1], target)
    monkeypatch.undo()
    assert contents(target) == before and whole(target) is None
    assert leftovers(tmp_path) == [], "staging directories left behind"


KILLER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from recipekit.bundle.build import compile_bundle, resolve
    from recipekit.bundle.write import write_bundle
    versions = [compile_bundle(resolve(["recipe=tiny_sft", f"train.seed={s}"])).files for s in (1, 2)]
    target = Path(sys.argv[1])
    print("ready", flush=True)
    index = 0
    while True:
        write_bundle(versions[index % 2], target)
        index += 1
    """
)


def test_a_killed_build_leaves_a_whole_bundle(versions, tmp_path: Path) -> None:
    """SIGKILL at random moments of back-to-back rebuilds: the target is always one whole bundle."""
    target = tmp_path / "bundle"
    write_bundle(versions[0], target)
    rng = random.Random(11)
    for _ in range(8):
        proc = subprocess.Popen([sys.executable, "-c", KILLER, str(target)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.01, 0.2))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert whole(target) is None
        assert contents(target) in (versions[0], versions[1])


def test_ctrl_c_is_held_while_the_bundle_is_put_in_place(versions, tmp_path: Path, monkeypatch) -> None:
    """A SIGINT arriving between the fallback's two renames is delivered after both: the target is never missing."""
    if not hasattr(signal, "pthread_sigmask"):
        pytest.skip("no signal masks here")
    target = tmp_path / "bundle"
    write_bundle(versions[0], target)
    monkeypatch.setattr(bundle, "_exchange", lambda a, b: (_ for _ in ()).throw(bundle._ExchangeUnsupported()))
    real_rename = os.rename
    states: list[bool] = []

    def rename(src, dst):
        result = real_rename(src, dst)
        if not states:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C right after the old bundle went aside
        states.append(target.exists())
        return result

    monkeypatch.setattr(bundle.os, "rename", rename)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever an earlier test installed
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait)  # a library's thread: the kernel may hand it the signal
    helper.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            write_bundle(versions[1], target)
    finally:
        stop.set()
        helper.join()
        signal.signal(signal.SIGINT, previous)
    monkeypatch.undo()
    assert states == [False, True]  # the second rename ran although Ctrl-C came first
    assert contents(target) == versions[1] and leftovers(tmp_path) == []


# ---------------------------------------------------------------------------------------- recognising bundles
FOREIGN = {
    "a JSON list naming the key": '["recipekit_version"]',
    "a JSON string": '"recipekit_version"',
    "a number": "5",
    "null": "null",
    "no files": '{"recipekit_version": "0.1.0"}',
    "empty files": '{"recipekit_version": "0.1.0", "files": {}}',
    "version not a string": '{"recipekit_version": 1, "files": {"a": "' + "0" * 64 + '"}}',
    "digest not sha256": '{"recipekit_version": "0.1.0", "files": {"a": "md5:abc"}}',
    "upper-case digest": '{"recipekit_version": "0.1.0", "files": {"a": "' + "A" * 64 + '"}}',
    "name escaping": '{"recipekit_version": "0.1.0", "files": {"../etc/passwd": "' + "0" * 64 + '"}}',
    "absolute name": '{"recipekit_version": "0.1.0", "files": {"/etc/passwd": "' + "0" * 64 + '"}}',
    "not JSON": "{",
    "nested 100000 deep": "[" * 100_000 + "]" * 100_000,
    "not UTF-8": b'{"recipekit_version": "caf\xe9"}',
}


@pytest.mark.parametrize("name", FOREIGN)
def test_a_directory_with_a_foreign_manifest_is_refused(versions, tmp_path: Path, name: str) -> None:
    target = tmp_path / "precious"
    target.mkdir()
    content = FOREIGN[name]
    (target / MANIFEST).write_bytes(content.encode() if isinstance(content, str) else content)
    (target / "thesis.tex").write_text("years of work")
    before = contents(target)
    assert not is_bundle(target) and manifest_problem(target)
    with pytest.raises(RecipeError) as info:
        write_bundle(versions[0], target)
    assert "not a recipekit bundle" in str(info.value) and "--force" in str(info.value)
    assert "\n" not in str(info.value)
    assert contents(target) == before and leftovers(tmp_path) == []


def test_a_real_bundle_and_an_empty_directory_are_replaced(versions, tmp_path: Path) -> None:
    write_bundle(versions[0], tmp_path / "b")
    assert is_bundle(tmp_path / "b")
    write_bundle(versions[1], tmp_path / "b")
    (tmp_path / "empty").mkdir()
    write_bundle(versions[0], tmp_path / "empty")
    assert contents(tmp_path / "b") == versions[1] and contents(tmp_path / "empty") == versions[0]


def test_a_directory_swapped_in_while_building_is_swapped_back(versions, tmp_path: Path, monkeypatch) -> None:
    """Checked, then replaced by someone else's directory before the exchange: it is put back, not deleted."""
    if not sys.platform.startswith("linux"):
        pytest.skip("renameat2 is Linux's")
    target = tmp_path / "bundle"
    write_bundle(versions[0], target)
    real_write = bundle._write_tree

    def write_then_swap(staging: Path, files: dict[str, bytes]) -> None:
        real_write(staging, files)
        os.rename(target, tmp_path / "moved-away")
        target.mkdir()
        (target / "thesis.tex").write_text("years of work")

    monkeypatch.setattr(bundle, "_write_tree", write_then_swap)
    with pytest.raises(RecipeError, match="changed while building"):
        write_bundle(versions[1], target)
    assert contents(target) == {"thesis.tex": b"years of work"}
    assert leftovers(tmp_path) == []


def test_the_fallback_replaces_whole(versions, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(bundle, "_exchange", lambda a, b: (_ for _ in ()).throw(bundle._ExchangeUnsupported()))
    target = tmp_path / "bundle"
    write_bundle(versions[0], target)
    write_bundle(versions[1], target)
    assert contents(target) == versions[1] and leftovers(tmp_path) == []


def test_force_never_replaces_the_home_or_working_directory(versions, tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    (home / "project").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(RecipeError, match="never replaces"):
        write_bundle(versions[0], home, force=True)
    monkeypatch.chdir(home / "project")
    with pytest.raises(RecipeError, match="never replaces"):
        write_bundle(versions[0], home / "project", force=True)
    assert sorted(p.name for p in home.iterdir()) == ["project"]


def test_an_os_error_mid_build_writes_nothing(versions, tmp_path: Path, monkeypatch) -> None:
    """Parents created for the build are removed again, the staging directory too; the error is one line."""

    def full(staging: Path, files: dict[str, bytes]) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(bundle, "_write_tree", full)
    with pytest.raises(RecipeError) as info:
        write_bundle(versions[0], tmp_path / "a" / "b" / "bundle")
    assert "No space left on device" in str(info.value) and "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_a_bundle_for_other_hardware_is_not_replaced_without_force(tmp_path: Path, monkeypatch) -> None:
    """Issue 32: ``build recipe=llama3_8b_sft hw=ascend910b`` then ``hw=h100`` both default to
    bundles/llama3_8b_sft; the second refuses (exit 2, one problem naming both and the ways out), leaving the Ascend
    bundle whole; the same hardware rebuilds, and --force replaces. The built line names the hardware."""
    from click.testing import CliRunner

    from recipekit.cli import main

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    first = runner.invoke(main, ["build", "recipe=llama3_8b_sft", "hw=ascend910b"])
    assert first.exit_code == 0 and " for ascend910b\n" in first.output, first.output
    before = contents(tmp_path / "bundles" / "llama3_8b_sft")
    second = runner.invoke(main, ["build", "recipe=llama3_8b_sft", "hw=h100"])
    assert second.exit_code == 2, second.output
    problems = [line for line in second.output.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and "ascend910b" in problems[0] and "h100" in problems[0], second.output
    assert "--force" in problems[0] and "--output DIR" in problems[0], second.output
    assert contents(tmp_path / "bundles" / "llama3_8b_sft") == before
    assert bundle.built_for(tmp_path / "bundles" / "llama3_8b_sft") == "ascend910b"
    again = runner.invoke(main, ["build", "recipe=llama3_8b_sft", "hw=ascend910b"])
    assert again.exit_code == 0, again.output
    forced = runner.invoke(main, ["build", "recipe=llama3_8b_sft", "hw=h100", "--force"])
    assert forced.exit_code == 0 and " for h100\n" in forced.output, forced.output
    assert bundle.built_for(tmp_path / "bundles" / "llama3_8b_sft") == "h100"


def test_a_parent_made_meanwhile_by_a_sibling_build_is_shared(versions, tmp_path: Path, monkeypatch) -> None:
    """``build -m`` writes bundles in parallel: two builds may both find ``out/`` missing and race to make it."""
    real_mkdir = Path.mkdir

    def sibling_wins(self: Path, *args, **kwargs) -> None:
        if self == tmp_path / "out" and not self.exists():
            real_mkdir(self)  # the sibling build made it between our check and our mkdir
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", sibling_wins)
    write_bundle(versions[0], tmp_path / "out" / "a")
    monkeypatch.setattr(Path, "mkdir", real_mkdir)
    assert contents(tmp_path / "out" / "a") == versions[0]
    write_bundle(versions[1], tmp_path / "out" / "b")  # and a failing build would not remove the shared parent
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a", "b"]


def test_a_bundle_of_another_recipe_is_replaced_only_with_force(tmp_path: Path, monkeypatch) -> None:
    """Issue 41 (Helm's install vs upgrade): a help example (4 nodes) silently replaced the tour's 2-node bundle of
    the same preset. Now the second build refuses (exit 2) naming what differs and leaves the bundle whole; --force
    replaces it and says what changed; the same recipe rebuilds without --force."""
    from click.testing import CliRunner

    from recipekit.cli import main

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    tour = ["build", "recipe=qwen2.5_14b_sft", "cluster.nodes=2", "parallel=zero3", "train.micro_batch_size=4"]
    assert runner.invoke(main, tour).exit_code == 0
    before = contents(tmp_path / "bundles" / "qwen2.5_14b_sft")
    example = ["build", "recipe=qwen2.5_14b_sft", "cluster.nodes=4", "parallel=zero3", "train.micro_batch_size=2"]
    refused = runner.invoke(main, example)
    assert refused.exit_code == 2, refused.output
    problems = [line for line in refused.output.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and "another recipe" in problems[0], refused.output
    assert "cluster.nodes 2 → 4" in problems[0] and "train.micro_batch_size 4 → 2" in problems[0]
    assert "--force" in problems[0] and "-o DIR" in problems[0]
    assert contents(tmp_path / "bundles" / "qwen2.5_14b_sft") == before
    same = runner.invoke(main, tour)
    assert same.exit_code == 0 and "replaced" not in same.output, same.output
    forced = runner.invoke(main, [*example, "--force"])
    assert forced.exit_code == 0, forced.output
    assert "replaced the bundle of another recipe: cluster.nodes 2 → 4" in " ".join(forced.output.split())
    assert contents(tmp_path / "bundles" / "qwen2.5_14b_sft") != before


def test_a_build_without_a_preset_is_not_named_after_one(tmp_path: Path, monkeypatch) -> None:
    """Issue 41: a bare ``recipekit build`` wrote bundles/llama3_8b_sft, which is not the llama3_8b_sft preset (ZeRO-2
    vs ZeRO-3, batch, learning rate). It is named after its hardware too, and says why; a name the user gives or a
    recipe that matches no preset's name keeps its name."""
    from click.testing import CliRunner

    from recipekit.cli import main

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    bare = runner.invoke(main, ["build"])
    assert bare.exit_code == 0, bare.output
    assert sorted(p.name for p in (tmp_path / "bundles").iterdir()) == ["llama3_8b_sft_ascend910b"]
    said = " ".join(bare.output.split())  # wrapped between words
    assert "not after the preset llama3_8b_sft" in said and "recipe=llama3_8b_sft" in said
    named = runner.invoke(main, ["build", "name=mine"])
    assert named.exit_code == 0 and (tmp_path / "bundles" / "mine").is_dir(), named.output
    lora = runner.invoke(main, ["build", "model=qwen2.5_7b", "mode=lora"])  # no preset is called qwen2.5_7b_lora
    assert lora.exit_code == 0 and (tmp_path / "bundles" / "qwen2.5_7b_lora").is_dir(), lora.output
    shown = runner.invoke(main, ["show", "--compact"])
    assert "name=llama3_8b_sft_ascend910b" in shown.output
