"""Solution packages: a bundle with the recipe sources it was composed from, checkable anywhere.

``pack`` turns a bundle directory into ``<name>-<digest>.tar.gz`` (see :mod:`~recipekit.handover.archive` for why its
bytes are reproducible; the digest is the first 16 hex digits of the archive's sha256)::

    <name>/recipekit-package.json   format, recipekit version, overrides, origin, image, sha256 of every entry
    <name>/bundle/...               the bundle's files, as built
    <name>/sources/0-built-in/...   every recipe file the composition read, per layer in search order:
    <name>/sources/1-<team>/...     chosen options, presets, nested defaults, the root config.yaml

Before writing, pack rebuilds the bundle from those very files and refuses if the bytes differ (the team repo
changed since the build): a package that does not reproduce is useless to its receiver.

``verify`` needs nothing but the archive and the same recipekit version: it checks the index hashes, the digest in
the file name and the bundle manifest's hashes, then rebuilds in a temporary directory from the packed sources —
with the packed overrides and the packed origin, whatever the current directory, user or environment — and
compares every file byte for byte. Every problem is one line and exit code 2 (tampered, truncated, foreign, or
packed by another recipekit version).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from recipekit import __version__
from recipekit.base.errors import Problem, RecipeError
from recipekit.base.limits import PACKAGE_FILE, read_regular
from recipekit.base.paths import did_you_mean
from recipekit.bundle.files import EXECUTABLE, MANIFEST, read_files
from recipekit.handover.archive import read_targz, write_targz
from recipekit.recipe.overrides import Override
from recipekit.runtime.boundary import jsonfile

FORMAT = "recipekit-package/1"
INDEX = "recipekit-package.json"
_DIGEST_NAME = re.compile(r"-([0-9a-f]{16})\.tar\.gz$")
_LABEL = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Packed:
    path: Path
    sha256: str
    bundle_files: int
    source_files: int


@dataclass(frozen=True)
class Verified:
    name: str
    bundle_files: int
    source_files: int
    recipekit_version: str


# ----------------------------------------------------------------------------------------------------------- pack
def pack(bundle: Path, output_dir: Path | None = None) -> Packed:
    """Pack ``bundle`` and the recipe files it was composed from into ``output_dir`` (default: the current one)."""
    bundle = Path(bundle)
    files = read_bundle_dir(bundle)
    manifest = bundle_manifest(files, str(bundle))
    problems = _manifest_problems(files, manifest, str(bundle))
    if manifest.get("recipekit_version") != __version__:
        problems.append(
            Problem(
                str(bundle),
                f"built by recipekit {manifest.get('recipekit_version')}; this is {__version__}",
                hint="rebuild it with this version, then pack",
            )
        )
    if problems:
        raise RecipeError(problems)
    origin = list(manifest.get("origin") or [])
    layers = [Path(str(entry.get("path", ""))) for entry in origin]
    missing = [Problem(f"origin {layer}", "team recipe layer not found") for layer in layers if not layer.is_dir()]
    if missing:
        hint = "pack where the bundle was built (its manifest names the team layers)"
        raise RecipeError([replace(p, hint=hint) for p in missing])
    overrides = [str(o) for o in manifest.get("overrides", [])]

    from recipekit.recipe.compose import loaded_configs, recipe_dirs

    rebuilt = rebuild(overrides, layers, origin)  # first: its composition scans every layer before Hydra reads one
    sources = loaded_configs(overrides, layers)
    changed = _compare(files, rebuilt, str(bundle))
    if changed:
        hint = "the recipe sources changed since the build: rebuild the bundle, then pack"
        raise RecipeError([replace(p, hint=hint) for p in changed])

    labels = ["built-in", *(_layer_label(entry, i) for i, entry in enumerate(origin, start=1))]
    layer_dirs = [f"sources/{i}-{label}" for i, label in enumerate(labels)]
    roots = recipe_dirs(layers)
    entries: dict[str, bytes] = {f"bundle/{name}": data for name, data in files.items()}
    for config in sources:
        relative = config.path.relative_to(roots[config.layer]).as_posix()
        entries[f"{layer_dirs[config.layer]}/{relative}"] = config.path.read_bytes()
    index = {
        "format": FORMAT,
        "recipekit_version": __version__,
        "name": manifest["name"],
        "overrides": overrides,
        "origin": origin,
        "layers": layer_dirs,
        "image": _image(files, manifest),
        "files": {name: _sha(data) for name, data in sorted(entries.items())},
    }
    top = str(manifest["name"])
    archive = write_targz(
        {f"{top}/{INDEX}": _json(index), **{f"{top}/{name}": data for name, data in entries.items()}},
        executable={f"{top}/bundle/{name}" for name in EXECUTABLE},
    )
    digest = _sha(archive)
    target_dir = Path(output_dir) if output_dir is not None else Path.cwd()
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / f"{top}-{digest[:16]}.tar.gz"
    _write_atomically(target, archive)
    return Packed(target, digest, len(files), len(sources))


def read_bundle_dir(bundle: Path) -> dict[str, bytes]:
    """A bundle directory's files; RecipeError if it is not a recipekit bundle."""
    if not bundle.is_dir():
        missing = "no such directory" + did_you_mean(bundle) if not bundle.exists() else "not a directory"
        raise RecipeError([Problem(str(bundle), missing)])
    if not (bundle / MANIFEST).is_file():
        raise RecipeError([Problem(str(bundle), f"not a recipekit bundle (no {MANIFEST})")])
    return read_files(bundle)[0]


def rebuild(overrides: Sequence[str], layers: Sequence[Path], origin: Sequence[Mapping[str, Any]]) -> dict[str, bytes]:
    """The bundle's files composed from ``layers`` only, with ``origin`` recorded as given (no git, no discovery).

    Built whether or not the plan predicts it fits: the bundle exists, so it was built (with --allow-oom if need be).
    """
    from recipekit.bundle.build import compile_bundle, resolve

    resolved = resolve(overrides, layers)
    resolved = replace(resolved, composed=replace(resolved.composed, origin=tuple(dict(o) for o in origin)))
    return compile_bundle(resolved, allow_oom=True).files


def _layer_label(entry: Mapping[str, Any], index: int) -> str:
    label = str(entry.get("repo") or Path(str(entry.get("path", f"layer{index}"))).name or f"layer{index}")
    return _LABEL.sub("_", label)


def _image(files: Mapping[str, bytes], manifest: Mapping[str, Any]) -> dict[str, str | None]:
    """The image reference (and digest when known): the manifest's when it records one, else the Job's."""
    recorded = manifest.get("image")
    if isinstance(recorded, dict):
        # ``recipekit image build`` records the reference as ``reference``; ``ref`` was this reader's old name
        return {"ref": recorded.get("reference") or recorded.get("ref"), "digest": recorded.get("digest")}
    ref = recorded if isinstance(recorded, str) else None
    if ref is None and "volcano-job.yaml" in files:
        from recipekit.base import yamlfile

        job = yamlfile.load(files["volcano-job.yaml"].decode("utf-8", "replace")) or {}
        for task in job.get("spec", {}).get("tasks", []) if isinstance(job, dict) else []:
            for container in task.get("template", {}).get("spec", {}).get("containers", []):
                ref = ref or container.get("image")
    digest = ref.split("@", 1)[1] if ref and "@sha256:" in ref else None
    return {"ref": ref, "digest": digest}


def _write_atomically(target: Path, data: bytes) -> None:
    handle, staging = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.chmod(staging, 0o644)
        os.replace(staging, target)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)


# --------------------------------------------------------------------------------------------------------- verify
def read_package(archive: Path) -> tuple[dict[str, Any], dict[str, bytes], list[Problem]]:
    """The package index, its entries (without the top directory) and the integrity problems found.

    Raises :class:`RecipeError` (one line) for an archive that is unreadable, unsafe or not a recipekit package.
    """
    what = str(archive)
    data = read_regular(Path(archive), PACKAGE_FILE, what)
    raw = read_targz(data, what)
    tops = {name.split("/", 1)[0] for name in raw}
    top = next(iter(tops))
    if len(tops) != 1 or f"{top}/{INDEX}" not in raw:
        raise RecipeError([Problem(what, f"not a recipekit package (no {INDEX})")])
    try:
        index = jsonfile.loads(raw[f"{top}/{INDEX}"], INDEX)
    except jsonfile.UntrustedJSON as exc:
        raise RecipeError([Problem(what, f"not a recipekit package ({exc})")]) from None
    shape = {"format": str, "recipekit_version": str, "name": str, "overrides": list, "origin": list}
    shape.update(layers=list, files=dict)
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise RecipeError([Problem(what, f"not a recipekit package (format is not {FORMAT})")])
    wrong = [key for key, kind in shape.items() if not isinstance(index.get(key), kind)]
    if wrong:
        raise RecipeError([Problem(what, f"not a recipekit package ({INDEX} lacks {', '.join(wrong)})")])
    entries = {name.split("/", 1)[1]: content for name, content in raw.items() if name != f"{top}/{INDEX}"}
    problems: list[Problem] = []
    listed: dict[str, Any] = index["files"]
    for name in sorted(set(listed) | set(entries)):
        if name not in entries:
            problems.append(Problem(f"{what}: {name}", "listed in the package index but missing"))
        elif name not in listed:
            problems.append(Problem(f"{what}: {name}", "not in the package index (added after packing?)"))
        elif _sha(entries[name]) != listed[name]:
            problems.append(Problem(f"{what}: {name}", "sha256 differs from the package index (changed after packing)"))
    match = _DIGEST_NAME.search(Path(archive).name)
    if match and not _sha(data).startswith(match.group(1)):
        problems.append(
            Problem(what, f"content sha256 is {_sha(data)[:16]}..., not the {match.group(1)} its name says")
        )
    return index, entries, problems


def verify(archive: Path) -> Verified:
    """Check ``archive`` completely; :class:`RecipeError` lists every problem found."""
    index, entries, problems = read_package(archive)
    what = str(archive)
    if index["recipekit_version"] != __version__:
        version = index["recipekit_version"]
        problems.append(
            Problem(
                what,
                f"packed with recipekit {version}; this is {__version__}, whose rebuild may differ",
                hint=f"verify with recipekit {version}: pip install 'recipekit=={version}'",
            )
        )
        raise RecipeError(problems)
    bundle = {name.removeprefix("bundle/"): data for name, data in entries.items() if name.startswith("bundle/")}
    manifest = bundle_manifest(bundle, f"{what}: bundle")
    problems.extend(_manifest_problems(bundle, manifest, f"{what}: bundle"))
    if manifest.get("origin", []) != index["origin"]:
        problems.append(Problem(f"{what}: {INDEX}", "origin differs from the bundle manifest's"))
    layers = [str(layer) for layer in index["layers"]]
    if any(not re.fullmatch(r"sources/\d+-[A-Za-z0-9._-]+", layer) for layer in layers):
        problems.append(Problem(f"{what}: {INDEX}", "malformed layer list"))
        raise RecipeError(problems)
    overrides = [str(o) for o in index["overrides"]]
    for override in overrides:  # a package configures its recipe, never Hydra (search path, launchers, ...)
        if Override.parse(override).key.startswith("hydra"):
            problems.append(Problem(f"{what}: {INDEX}", f"override {override!r} is not allowed in a package"))
    if any(p.key == f"{what}: {INDEX}" for p in problems):
        raise RecipeError(problems)
    sources = {name: data for name, data in entries.items() if name.startswith("sources/")}
    strays = [name for name in sources if not any(name.startswith(f"{layer}/") for layer in layers)]
    problems.extend(Problem(f"{what}: {name}", "not inside a listed source layer") for name in strays)
    with tempfile.TemporaryDirectory(prefix="recipekit-verify-") as tmp:
        root = Path(tmp)
        dirs = [root / layer for layer in layers]
        for directory in dirs:
            directory.mkdir(parents=True)
        for name, data in sources.items():
            target = (root / name).resolve()
            if name in strays or not target.is_relative_to(root.resolve()):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        try:
            # the manifest's own origin (key order included): the rebuilt manifest must match it byte for byte
            rebuilt = rebuild(overrides, dirs, manifest.get("origin", []))
        except RecipeError as err:
            problems.extend(Problem(f"{what}: rebuild", str(p)) for p in err.problems)
        else:
            problems.extend(_compare(bundle, rebuilt, f"{what}: bundle"))
    if problems:
        raise RecipeError(problems)
    return Verified(str(index["name"]), len(bundle), len(sources), __version__)


# -------------------------------------------------------------------------------------------------------- shared
def bundle_manifest(files: Mapping[str, bytes], what: str) -> dict[str, Any]:
    if MANIFEST not in files:
        raise RecipeError([Problem(what, f"not a recipekit bundle (no {MANIFEST})")])
    try:
        manifest = jsonfile.loads(files[MANIFEST], f"{what}/{MANIFEST}")
    except jsonfile.UntrustedJSON as exc:
        raise RecipeError([Problem(exc.source, exc.reason)]) from None
    if not isinstance(manifest, dict) or "recipekit_version" not in manifest or "name" not in manifest:
        raise RecipeError([Problem(f"{what}/{MANIFEST}", "not a recipekit manifest")])
    return manifest


def _manifest_problems(files: Mapping[str, bytes], manifest: Mapping[str, Any], what: str) -> list[Problem]:
    """Each file whose sha256 differs from the manifest's, each missing one and each not listed."""
    listed = manifest.get("files")
    if not isinstance(listed, dict):
        return [Problem(f"{what}/{MANIFEST}", "has no file hashes")]
    problems = []
    for name in sorted(set(listed) | (set(files) - {MANIFEST})):
        if name not in files:
            problems.append(Problem(f"{what}/{name}", "listed in the manifest but missing"))
        elif name not in listed:
            problems.append(Problem(f"{what}/{name}", "not in the manifest (added after the build?)"))
        elif _sha(files[name]) != listed[name]:
            problems.append(Problem(f"{what}/{name}", "sha256 differs from the manifest (edited after the build?)"))
    return problems


def _compare(have: Mapping[str, bytes], rebuilt: Mapping[str, bytes], what: str) -> list[Problem]:
    """One problem per file whose bytes differ from the rebuild's, with the first differing line."""
    problems = []
    for name in sorted(set(have) | set(rebuilt)):
        if name not in rebuilt:
            problems.append(Problem(f"{what}/{name}", "not produced by the rebuild"))
        elif name not in have:
            problems.append(Problem(f"{what}/{name}", "missing (the rebuild produces it)"))
        elif have[name] != rebuilt[name]:
            problems.append(
                Problem(f"{what}/{name}", f"differs from the rebuild ({_first_difference(have[name], rebuilt[name])})")
            )
    return problems


def _first_difference(old: bytes, new: bytes) -> str:
    old_lines, new_lines = old.splitlines(), new.splitlines()
    for number, (a, b) in enumerate(zip(old_lines, new_lines), start=1):
        if a != b:
            return f"first at line {number}"
    return f"{len(old_lines)} vs {len(new_lines)} lines"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _json(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
