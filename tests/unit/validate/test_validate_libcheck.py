"""The library cross-checks' cost controls: the cache is keyed by what is checked (not by bundle), and the child's
trimmed imports leave the libraries' answers unchanged.

The verdicts themselves (a mismatch the Trainer would refuse, each mismatch reported) are tested through the real
child in test_validate_static.py.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from recipekit.bundle.build import build
from recipekit.validate.shared.loader import load_bundle
from recipekit.validate.static import libraries
from recipekit.validate.static.checks import run_static
from recipekit.validate.static.librarychild import DeferredModule

ARGS = {"output_dir": "/mnt/shared/runs/a-1f2e3d", "run_name": "a", "learning_rate": 1e-5, "bf16": True}
VERSIONS = {"transformers": "5.0", "deepspeed": "0.19", "accelerate": "1.0", "torch": "2.9"}


def bundle_like(args: dict, world: int = 8) -> SimpleNamespace:
    return SimpleNamespace(args=args, ds_config={"train_batch_size": "auto"}, plan={"world_size": world})


def key(args: dict, world: int = 8) -> str:
    return libraries.cache_key(libraries.payload_of(bundle_like(args, world)), VERSIONS)


def test_the_cache_key_ignores_the_run_s_name_but_not_what_is_checked() -> None:
    renamed = {**ARGS, "output_dir": "/mnt/shared/runs/b-9a8b7c", "run_name": "b"}
    assert key(renamed) == key(ARGS)
    assert key({**ARGS, "learning_rate": 2e-5}) != key(ARGS)
    assert key(ARGS, world=16) != key(ARGS)
    assert libraries.cache_key(libraries.payload_of(bundle_like(ARGS)), {**VERSIONS, "transformers": "5.1"}) != key(
        ARGS
    )
    # The child checks the stand-ins it was keyed by, so a cached answer is exactly its answer.
    checked = libraries.payload_of(bundle_like(ARGS))["training_arguments"]
    assert checked["output_dir"] == libraries.IDENTITY_ARGS["output_dir"] and checked["learning_rate"] == 1e-5
    assert ARGS["output_dir"] == "/mnt/shared/runs/a-1f2e3d"  # the bundle's own arguments are untouched
    assert libraries.payload_of(bundle_like({**ARGS, "output_dir": 3}))["training_arguments"]["output_dir"] == 3


def test_a_deferred_module_answers_what_it_knows_and_imports_the_real_one_for_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "recipekit_test_heavy.py").write_text("IMPORTED = True\ndef probe():\n    return 'real'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    name = "recipekit_test_heavy"
    stand_in = DeferredModule(name, {"probe": lambda: "stand-in"})
    monkeypatch.setitem(sys.modules, name, stand_in)
    assert importlib.import_module(name).probe() == "stand-in"
    with pytest.raises(AttributeError):
        stand_in.__file__  # introspection does not import it  # noqa: B018
    assert sys.modules[name] is stand_in
    assert stand_in.IMPORTED is True  # anything else: the real module, now in sys.modules
    assert sys.modules[name] is not stand_in and sys.modules[name].probe() == "real"


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("transformers", "deepspeed")), reason="needs the training stack"
)
def test_a_new_bundle_with_equal_trainer_arguments_is_answered_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # nothing cached yet
    first = build(["recipe=tiny_sft"], tmp_path / "first", force=True).path
    other = build(["recipe=tiny_sft", "data.path=/mnt/shared/data/other.jsonl"], tmp_path / "other", force=True).path
    a, b = load_bundle(first), load_bundle(other)
    assert a.args["output_dir"] != b.args["output_dir"]  # another run, another output directory
    ran = {r.id: r for r in run_static(a) if r.id.startswith("library.")}
    assert all(r.status.value == "pass" and "cached" not in r.reason for r in ran.values()), ran
    assert ran["library.transformers"].details["modelling_stack_imported"] is False  # the trimmed imports held
    hit = [r for r in run_static(b) if r.id.startswith("library.")]
    assert all(r.status.value == "pass" and r.reason.endswith("(cached result)") for r in hit), hit


def test_a_ds_config_the_loader_refused_starts_no_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unreadable ds_config.json (its finding names it) is not checked against a stand-in: no child imports the
    training stack for it (a hostile bundle's validate stays small), and both results say why they were skipped."""
    from recipekit.validate.shared.results import Finding, Status

    monkeypatch.setattr(libraries, "_versions", lambda: VERSIONS)
    started = []
    monkeypatch.setattr(libraries.subprocess, "Popen", lambda *a, **k: started.append(a))
    refused = bundle_like(ARGS)
    refused.ds_config = None
    refused.parse_findings = [Finding("ds_config.json", "", "JSON nested more than 64 levels deep")]
    results = libraries.finish(libraries.start(refused))
    assert not started
    assert all(r.status is Status.SKIP and "ds_config.json could not be read" in r.reason for r in results)
