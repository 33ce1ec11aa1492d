"""The dry run's data substitutions: generated data where the recipe's would be (a glob included), small prepare
chunks so that every pod prepares a share, and no exact counts of the real data left behind."""

from __future__ import annotations

from pathlib import Path

from recipekit.bundle.build import resolve
from recipekit.runtime.data.sources import find_files, plan_chunks
from recipekit.validate.dryrun.options import DryRunOptions
from recipekit.validate.dryrun.workdir.substitutions import substitute


def substituted(tmp_path: Path, *overrides: str):
    recipe = resolve(["recipe=tiny_sft", *overrides]).recipe
    dry, subs = substitute(recipe, DryRunOptions(pods=2), tmp_path)
    return dry, {s.field: s for s in subs}


def test_the_pods_get_several_chunks_each_of_the_generated_data(tmp_path):
    dry, subs = substituted(tmp_path, "data.num_rows=123456", "data.num_tokens=9999999")
    files = find_files(dry.data.path, dry.data.format)
    chunks = plan_chunks(files, int(dry.data.shard_mib * 2**20))
    assert 6 <= len(chunks) <= 10  # about four per pod
    assert (
        subs["recipe.data.shard_mib"].old == 64.0 and "every pod prepares a share" in subs["recipe.data.shard_mib"].why
    )
    assert dry.data.num_rows is None and dry.data.num_tokens is None  # the real data's counts are not the tiny data's
    assert Path(dry.data.path).is_relative_to(tmp_path / "shared")


def test_a_glob_becomes_a_directory_of_generated_files_and_prepared_dir_moves_to_the_work_volume(tmp_path):
    dry, subs = substituted(
        tmp_path, "data.path=/mnt/shared/corpus/**/*.jsonl", "data.prepared_dir=/mnt/shared/cache/prepared"
    )
    assert Path(dry.data.path) == tmp_path / "shared" / "corpus" / "tiny"  # the PVC /mnt/shared is shared/ here
    assert len(find_files(dry.data.path, "alpaca")) == 3
    assert dry.data.prepared_dir == str(tmp_path / "shared" / "cache" / "prepared")
    assert subs["recipe.data.prepared_dir"].old == "/mnt/shared/cache/prepared"


def test_the_grad_norm_alert_is_lifted_above_a_tiny_twins_noise_and_said_so(tmp_path):
    """A passing default dry run raised grad_norm_jump alerts (a tiny twin's per-step norm moves by a third by
    noise): the work copy lifts the limit to a 3× change, as a listed substitution with its reason."""
    dry, subs = substituted(tmp_path)
    change = subs["recipe.ops.grad_norm_jump_ratio"]
    assert change.old == 0.3 and change.new == dry.ops.grad_norm_jump_ratio == 3.0
    assert "noise" in change.why
