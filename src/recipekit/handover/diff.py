"""``recipekit diff A B``: what differs between two bundles (directories or packages), the cause before the effect.

First the resolved recipe keys that differ (``train.micro_batch_size: 1 → 2``), read from each manifest: that is
usually the whole story. Then the files: added, removed and changed, each changed text file with a short unified
diff. manifest.json is listed without its diff — its lines are the hashes and the recipe keys already shown. Last,
whether the two run the same image (one per software stack): when they do, everything that differs travels in the
run files (the ConfigMap) and the Job, and no image is built for the second.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipekit.base import yamlfile
from recipekit.base.errors import Problem, RecipeError
from recipekit.base.limits import DIFF_FILE, DIFF_LINE
from recipekit.bundle.files import MANIFEST, RECIPE, read_files
from recipekit.recipe.schema import printable

#: Lines of unified diff shown per changed file; the rest is summarised.
DIFF_LINES = 24


@dataclass(frozen=True)
class Side:
    label: str
    files: dict[str, bytes]
    recipe: dict[str, Any]
    #: entries no bundle has (links, FIFOs, devices, other directories): never followed or read, never "identical"
    strays: tuple[str, ...] = ()

    @property
    def image(self) -> str | None:
        """The image the bundle's plan names (recipe.yaml ``plan.image``), or None when it names none."""
        try:
            doc = yamlfile.load(self.files.get(RECIPE, b"").decode("utf-8", "replace"), RECIPE)
        except Exception:  # noqa: BLE001 - an unreadable recipe.yaml names no image; its diff shows why
            return None
        plan = doc.get("plan") if isinstance(doc, dict) else None
        image = plan.get("image") if isinstance(plan, dict) else None
        return image if isinstance(image, str) else None


def load_side(path: Path) -> Side:
    """A bundle directory or a package archive (whose integrity is checked first: a diff of tampered bytes lies)."""
    from recipekit.handover.package import bundle_manifest, read_package

    path = Path(path)
    strays: list[str] = []
    if path.is_dir():
        files, strays = read_files(path)  # bundle_manifest below refuses a directory without a manifest
    elif path.is_file():
        _, entries, problems = read_package(path)
        if problems:
            raise RecipeError(problems)
        files = {n.removeprefix("bundle/"): d for n, d in entries.items() if n.startswith("bundle/")}
    else:
        raise RecipeError([Problem(str(path), "no such bundle directory or package")])
    manifest = bundle_manifest(files, str(path))
    return Side(str(path), files, manifest.get("recipe") or {}, tuple(strays))


def diff(a: Side, b: Side) -> list[str]:
    """The report's lines, every one printable (a control character of a file name or of a file's text is written
    as its escape, never sent to the terminal); empty when the two bundles are identical. An entry no bundle has
    (a link, a FIFO, a device) is listed as not compared: two bundles holding one are never called identical."""
    return [printable(line) for line in _lines(a, b)]


def _lines(a: Side, b: Side) -> list[str]:
    keys = recipe_changes(a.recipe, b.recipe)
    names = sorted(set(a.files) | set(b.files))
    changed = [n for n in names if a.files.get(n) != b.files.get(n)]
    strays = [f"  {side.label}: {name} (a link, FIFO, device or directory no bundle has)"
              for side in (a, b) for name in side.strays]  # fmt: skip
    if not keys and not changed and not strays:
        return []
    if strays:
        strays.insert(0, f"not compared ({len(strays)}: never followed or read):")
    lines = [f"recipe keys ({len(keys)} differ):", *(f"  {line}" for line in keys)]
    lines.append(f"files ({len(changed)} differ):")
    for name in changed:
        if name not in a.files:
            lines.append(f"  added {name}")
        elif name not in b.files:
            lines.append(f"  removed {name}")
        else:
            lines.append(f"  changed {name}")
            if name != MANIFEST:
                lines.extend(f"    {line}" for line in _unified(a, b, name))
    return [*lines, *(image_lines(a, b) if keys or changed else []), *strays]


def image_lines(a: Side, b: Side) -> list[str]:
    """Whether the two bundles run one image: the same software stack needs no second build."""
    if a.image is None or b.image is None:
        return []
    if a.image == b.image:
        return [f"image: the same ({a.image}): what differs travels in the run files and the Job"]
    return [f"image: {a.image} → {b.image} (another software stack: `recipekit image build` the second)"]


def recipe_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The resolved recipe keys that differ, one line each (the cause list of :func:`diff`; ``compare`` shows it)."""
    return list(_key_changes(old, new))


def _key_changes(old: Any, new: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in [*old, *(k for k in new if k not in old)]:
            dotted = f"{prefix}.{key}" if prefix else str(key)
            if key not in new:
                yield f"{dotted}: {_show(old[key])} → (absent)"
            elif key not in old:
                yield f"{dotted}: (absent) → {_show(new[key])}"
            else:
                yield from _key_changes(old[key], new[key], dotted)
    elif old != new:
        yield f"{prefix}: {_show(old)} → {_show(new)}"


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value


def _unified(a: Side, b: Side, name: str) -> list[str]:
    largest = max(len(a.files[name]), len(b.files[name]))
    if largest > DIFF_FILE.bytes:  # difflib holds both files' lines and more: sizes only
        return [
            f"({len(a.files[name]):,} → {len(b.files[name]):,} bytes: over the line-diff limit of {DIFF_FILE.value} "
            f"{DIFF_FILE.unit}; raise it with {DIFF_FILE.variable}=N)"
        ]
    try:
        old, new = a.files[name].decode("utf-8"), b.files[name].decode("utf-8")
    except UnicodeDecodeError:
        return ["(binary)"]
    lines = list(
        difflib.unified_diff(
            old.splitlines(), new.splitlines(), f"{a.label}/{name}", f"{b.label}/{name}", n=1, lineterm=""
        )
    )
    if len(lines) > DIFF_LINES:
        lines = [*lines[:DIFF_LINES], f"... {len(lines) - DIFF_LINES} more diff lines"]
    width = DIFF_LINE.value
    return [
        line if len(line) <= width else f"{line[:width]}... ({len(line) - width:,} more characters)" for line in lines
    ]
