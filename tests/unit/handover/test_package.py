"""Solution packages: pack is deterministic; verify passes anywhere and catches any changed byte; bad archives are a
one-line error with exit code 2."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit import __version__
from recipekit.base.errors import RecipeError
from recipekit.bundle.files import read_files
from recipekit.cli import main
from recipekit.handover.archive import read_targz, write_targz
from recipekit.handover.package import INDEX, pack, verify

SRC = Path(__file__).resolve().parents[3] / "src"


def run(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def team_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """bundles/our_qwen_sft built in a scaffolded team repo that also holds an option the recipe does not use."""
    assert run("init", str(tmp_path / "team-nlp-recipes")).exit_code == 0
    repo = tmp_path / "team-nlp-recipes"
    (repo / "recipes" / "data").mkdir()
    (repo / "recipes" / "data" / "unused.yaml").write_text("name: unused\n")
    monkeypatch.chdir(repo)
    assert run("build", "recipe=our_qwen_sft").exit_code == 0
    return repo / "bundles" / "our_qwen_sft"


@pytest.fixture
def package(team_bundle: Path, tmp_path: Path) -> Path:
    return pack(team_bundle, tmp_path / "out").path


def members(archive: bytes) -> dict[str, bytes]:
    return read_targz(archive, "test")


def repack(archive: Path, target: Path, change: dict[str, bytes], *, update_index: bool = False) -> Path:
    """``archive`` with some entries replaced, written as a well-formed tar.gz (what a careless or deliberate edit
    of an unpacked package, packed again, looks like)."""
    entries = members(archive.read_bytes())
    entries.update(change)
    if update_index:
        import hashlib

        (index_name,) = [n for n in entries if n.endswith(INDEX)]
        index = json.loads(entries[index_name])
        top = index_name.split("/")[0]
        for name in change:
            index["files"][name.removeprefix(f"{top}/")] = hashlib.sha256(change[name]).hexdigest()
        entries[index_name] = json.dumps(index).encode()
    target.write_bytes(write_targz(entries))
    return target


def problems_of(archive: Path) -> list[str]:
    with pytest.raises(RecipeError) as info:
        verify(archive)
    return [str(p) for p in info.value.problems]


def test_pack_twice_gives_identical_bytes(team_bundle: Path, tmp_path: Path) -> None:
    first = pack(team_bundle, tmp_path / "a")
    second = pack(team_bundle, tmp_path / "b")
    assert first.path.name == second.path.name == f"our_qwen_sft-{first.sha256[:16]}.tar.gz"
    assert first.path.read_bytes() == second.path.read_bytes()
    assert run("build", "recipe=our_qwen_sft").exit_code == 0  # rebuilt: same bundle, same package
    assert pack(team_bundle, tmp_path / "c").path.read_bytes() == first.path.read_bytes()


def test_archive_is_normalised(package: Path) -> None:
    data = package.read_bytes()
    assert data[3] == 0, "no file name (or other optional field) in the gzip header"
    assert data[4:8] == b"\0\0\0\0", "gzip header mtime is 0"
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
        infos = tar.getmembers()
    names = [info.name for info in infos]
    assert names == sorted(names) and all(info.isreg() for info in infos)
    assert {(i.mtime, i.uid, i.gid, i.uname, i.gname) for i in infos} == {(0, 0, 0, "", "")}
    assert {i.name: i.mode for i in infos if i.mode != 0o644} == {"our_qwen_sft/bundle/run.sh": 0o755}


def test_package_holds_bundle_sources_version_and_image(package: Path, team_bundle: Path) -> None:
    entries = members(package.read_bytes())
    index = json.loads(entries[f"our_qwen_sft/{INDEX}"])
    assert index["recipekit_version"] == __version__ and index["overrides"] == ["recipe=our_qwen_sft"]
    # the image of the bundle's software stack (one per stack, not per recipe), under the team's registry
    assert index["image"]["ref"].startswith("registry.example.com/team-nlp-recipes/recipekit-ascend-910b:")
    assert index["layers"] == ["sources/0-built-in", "sources/1-team-nlp-recipes"]
    team = sorted(n for n in entries if n.startswith("our_qwen_sft/sources/1-"))
    assert team == [
        "our_qwen_sft/sources/1-team-nlp-recipes/cluster/team.yaml",
        "our_qwen_sft/sources/1-team-nlp-recipes/model/our_qwen2.5_7b.yaml",
        "our_qwen_sft/sources/1-team-nlp-recipes/recipe/our_qwen_sft.yaml",
    ], "exactly the team files composed (not data/unused.yaml)"
    built_in = {n.split("/", 3)[3] for n in entries if n.startswith("our_qwen_sft/sources/0-")}
    assert {"config.yaml", "cluster/default.yaml", "model/qwen2.5_7b.yaml", "recipe/our_qwen_sft.yaml"} - built_in == {
        "recipe/our_qwen_sft.yaml"
    }, "the built-in files the team options extend are packed too"
    bundle = {n.split("/bundle/", 1)[1]: d for n, d in entries.items() if "/bundle/" in n}
    assert bundle == read_files(team_bundle)[0]


def test_verify_passes_in_another_directory_without_the_team_repo(package: Path, tmp_path: Path) -> None:
    """Another directory, HOME and cache, a hostile recipekit.toml and $RECIPEKIT_RECIPES, and no team repo:
    verify reads none of them. As another user too, where this machine's interpreter allows one."""
    elsewhere = tmp_path / "receiver"
    elsewhere.mkdir()
    received = Path(shutil.copy(package, elsewhere))
    bundle_files = sum(1 for name in members(package.read_bytes()) if "/bundle/" in name)
    shutil.rmtree(tmp_path / "team-nlp-recipes")
    (elsewhere / "recipekit.toml").write_text('name = "hostile"\nrecipekit = ">=99"\n')
    env = {
        **os.environ,
        "PYTHONPATH": str(SRC),
        "HOME": str(elsewhere),
        "XDG_CACHE_HOME": str(elsewhere / "cache"),
        "USER": "someone-else",
        "RECIPEKIT_RECIPES": str(elsewhere / "missing"),
    }
    command = [sys.executable, "-m", "recipekit.cli", "verify", received.name]
    result = subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"verified {received.name}: {bundle_files} bundle files and ")
    if _can_run_as_nobody():
        elsewhere.chmod(0o755)
        tmp_path.chmod(0o755)
        received.chmod(0o644)
        env.update(HOME="/nonexistent", XDG_CACHE_HOME="/nonexistent")
        result = subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, user=65534)
        assert result.returncode == 0, result.stdout + result.stderr


def _can_run_as_nobody() -> bool:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False
    probe = [sys.executable, "-c", "import recipekit"]
    try:
        return subprocess.run(probe, env={"PYTHONPATH": str(SRC)}, user=65534, capture_output=True).returncode == 0
    except OSError:
        return False


def test_verify_catches_a_changed_byte_in_any_file(package: Path, tmp_path: Path) -> None:
    entries = members(package.read_bytes())
    assert any("/sources/1-" in name for name in entries) and any("/bundle/" in name for name in entries)
    for name, data in entries.items():
        changed = bytearray(data)
        changed[len(changed) // 2] ^= 0x01
        found = problems_of(repack(package, tmp_path / "tampered.tar.gz", {name: bytes(changed)}))
        inner = name.split("/", 1)[1]
        # a changed index names the entry whose listed hash no longer matches (or its JSON no longer parses)
        assert found and (inner == INDEX or any(inner in problem for problem in found)), (name, found)


def test_verify_catches_edits_that_also_update_the_hashes(package: Path, tmp_path: Path) -> None:
    entries = members(package.read_bytes())
    run_sh = entries["our_qwen_sft/bundle/run.sh"] + b"echo extra\n"
    found = problems_of(
        repack(package, tmp_path / "t.tar.gz", {"our_qwen_sft/bundle/run.sh": run_sh}, update_index=True)
    )
    assert any("bundle/run.sh: sha256 differs from the manifest" in p for p in found)
    manifest = json.loads(entries["our_qwen_sft/bundle/manifest.json"])
    import hashlib

    manifest["files"]["run.sh"] = hashlib.sha256(run_sh).hexdigest()
    change = {"our_qwen_sft/bundle/run.sh": run_sh, "our_qwen_sft/bundle/manifest.json": json.dumps(manifest).encode()}
    found = problems_of(repack(package, tmp_path / "t.tar.gz", change, update_index=True))
    assert any("bundle/run.sh: differs from the rebuild" in p for p in found), found
    source = "our_qwen_sft/sources/1-team-nlp-recipes/cluster/team.yaml"
    edited = entries[source].replace(b"queue: team-nlp-recipes", b"queue: someone-elses")
    found = problems_of(repack(package, tmp_path / "t.tar.gz", {source: edited}, update_index=True))
    assert any("differs from the rebuild" in p for p in found), found


def test_a_renamed_digest_is_caught(package: Path, tmp_path: Path) -> None:
    other = tmp_path / "our_qwen_sft-0000000000000000.tar.gz"
    shutil.copy(package, other)
    assert any("not the 0000000000000000 its name says" in p for p in problems_of(other))
    shutil.copy(package, tmp_path / "renamed.tar.gz")
    verify(tmp_path / "renamed.tar.gz")


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("truncated", "truncated (the gzip stream ends early)"),
        ("trailing", "unexpected bytes after the gzip stream"),
        ("corrupt", "corrupt gzip data"),
        ("foreign", "not a gzip file"),
        ("plain-tar.gz", "not a recipekit package (no recipekit-package.json)"),
        ("traversal", "unsafe entry name '../evil.yaml'"),
        ("absolute", "unsafe entry name '/etc/evil'"),
        ("symlink", "is not a regular file"),
        ("missing", "cannot be read (No such file or directory)"),
    ],
)
def test_bad_packages_are_one_line_exit_2(package: Path, tmp_path: Path, kind: str, message: str) -> None:
    data = package.read_bytes()
    bad = tmp_path / f"{kind}.tar.gz"
    if kind == "truncated":
        bad.write_bytes(data[: len(data) // 2])
    elif kind == "trailing":
        bad.write_bytes(data + b"extra")
    elif kind == "corrupt":
        bad.write_bytes(data[:40] + bytes(b ^ 0xFF for b in data[40:60]) + data[60:])
    elif kind == "foreign":
        bad.write_bytes(b"PK\x03\x04 a zip file")
    elif kind == "plain-tar.gz":
        bad.write_bytes(write_targz({"project/README.md": b"hello\n"}))
    elif kind in ("traversal", "absolute", "symlink"):
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w") as tar:
            info = tarfile.TarInfo({"traversal": "../evil.yaml", "absolute": "/etc/evil", "symlink": "x/link"}[kind])
            if kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info, io.BytesIO(b""))
        bad.write_bytes(gzip.compress(raw.getvalue()))
    result = run("verify", str(bad))
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines[0] == "error: 1 problem:" and len(lines) == 2 and message in lines[1], result.output
    assert "Traceback" not in result.output
    assert not (tmp_path.parent / "evil.yaml").exists()


def test_another_recipekit_version_is_refused(package: Path, tmp_path: Path) -> None:
    entries = members(package.read_bytes())
    index = json.loads(entries[f"our_qwen_sft/{INDEX}"])
    index["recipekit_version"] = "9.9.9"
    found = problems_of(repack(package, tmp_path / "old.tar.gz", {f"our_qwen_sft/{INDEX}": json.dumps(index).encode()}))
    assert f"packed with recipekit 9.9.9; this is {__version__}" in found[-1]
    assert "pip install 'recipekit==9.9.9'" in found[-1]


def test_pack_refuses_an_edited_bundle_or_changed_sources(team_bundle: Path, tmp_path: Path) -> None:
    run_sh = team_bundle / "run.sh"
    original = run_sh.read_bytes()
    run_sh.write_bytes(original + b"# hand edit\n")
    result = run("pack", str(team_bundle), "-o", str(tmp_path / "out"))
    assert (
        result.exit_code == 2 and "run.sh: sha256 differs from the manifest (edited after the build?)" in result.output
    )
    run_sh.write_bytes(original)
    team = team_bundle.parents[1] / "recipes" / "cluster" / "team.yaml"
    team.write_text(team.read_text().replace("max_retry", "max_retry").replace("queue: team-nlp-recipes", "queue: q2"))
    result = run("pack", str(team_bundle), "-o", str(tmp_path / "out"))
    assert result.exit_code == 2 and "the recipe sources changed since the build" in result.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_built_in_recipe_packs_and_verifies(tmp_path: Path) -> None:
    assert run("build", "recipe=tiny_sft", "hw=h100", "-o", str(tmp_path / "tiny")).exit_code == 0
    result = run("pack", str(tmp_path / "tiny"), "-o", str(tmp_path))
    assert result.exit_code == 0, result.output
    (archive,) = tmp_path.glob("tiny_sft-*.tar.gz")
    result = run("verify", str(archive))
    assert result.exit_code == 0 and result.output.startswith("verified"), result.output
    assert "origin" not in json.loads((tmp_path / "tiny" / "manifest.json").read_text())


def test_a_package_may_not_configure_hydra(package: Path, tmp_path: Path) -> None:
    entries = members(package.read_bytes())
    index = json.loads(entries[f"our_qwen_sft/{INDEX}"])
    index["overrides"].append("hydra.searchpath=[file:///etc]")
    change = {f"our_qwen_sft/{INDEX}": json.dumps(index).encode()}
    found = problems_of(repack(package, tmp_path / "hostile.tar.gz", change))
    assert any("override 'hydra.searchpath=[file:///etc]' is not allowed in a package" in p for p in found)
