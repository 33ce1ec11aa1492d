"""recipekit.memory.advise: only layouts that fit, fastest first, and overrides that compose back to each of them."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "src"))

from recipekit.bundle.planview import advice_dict, advice_lines, render_advice  # noqa: E402
from recipekit.image.matrix import load_images  # noqa: E402
from recipekit.memory import advise, candidate, estimate  # noqa: E402
from recipekit.memory.advise import shown_step  # noqa: E402
from recipekit.plan.plan import make_plan  # noqa: E402
from recipekit.recipe.compose import compose  # noqa: E402
from recipekit.recipe.paralleloptions import load_parallel_options  # noqa: E402
from recipekit.recipe.sections import parse_recipe  # noqa: E402

IMAGES = load_images()
OPTIONS = load_parallel_options()

BASES = [
    ("recipe=qwen2.5_14b_sft",),
    ("recipe=llama3_70b_sft", "cluster.nodes=1"),
    ("recipe=llama3_8b_lora",),
    ("recipe=llama3_8b_lora", "mode=qlora", "hw=a100_80g"),
    ("recipe=tiny_sft",),  # pins gradient_accumulation_steps instead of a global batch
    ("recipe=qwen2.5_7b_pretrain", "hw=h100"),
    ("recipe=qwen2.5_14b_sft", "parallel.reduce_bucket_size=100000000", "train.precision=fp16"),
]


@functools.cache
def recipe_of(*overrides: str):
    """Hydra composition costs about half a second; the tests compose the same recipes again and again."""
    return parse_recipe(compose(list(overrides)).raw)


@functools.cache
def advice_for(base: tuple[str, ...], search_pp: bool = False):
    return tuple(advise(recipe_of(*base), IMAGES, search_pp=search_pp, parallel_options=OPTIONS))


@pytest.mark.parametrize("base", BASES, ids=" ".join)
def test_advice_always_fits(base):
    advices = advice_for(base)
    assert advices, base
    for advice in advices:
        est = advice.estimate
        assert est.fits and est.total_gib <= est.device_gib and est.offload.host_fits, advice.overrides


@pytest.mark.parametrize("base", BASES, ids=" ".join)
def test_advice_overrides_compose_to_the_advised_plan(base):
    for advice in advice_for(base):
        recipe = recipe_of(*base, *advice.overrides)
        assert recipe == advice.estimate.recipe, advice.overrides
        plan = make_plan(recipe, IMAGES, analysis_only=True)  # as advise plans its candidates
        assert plan.summary() == advice.estimate.plan.summary()
        assert estimate(recipe, plan) == advice.estimate


@pytest.mark.parametrize("base", BASES, ids=" ".join)
def test_advice_keeps_the_global_batch_and_ranks_by_step_time(base):
    advices = advice_for(base)
    expected = make_plan(recipe_of(*base), IMAGES, analysis_only=True).layout.global_batch_size
    assert {a.estimate.layout.global_batch_size for a in advices} == {expected}
    times = [shown_step(a.step_time_s) for a in advices]
    assert times == sorted(times)
    assert len(advices) <= 5 and len({a.overrides for a in advices}) == len(advices)


def test_advice_on_a_cluster_too_small_for_plain_zero_offloads():
    advices = advice_for(("recipe=llama3_70b_sft", "cluster.nodes=1"))
    assert all(a.estimate.offload.time_s > 0 for a in advices)
    assert all(any(o.startswith("parallel=zero3") for o in a.overrides) for a in advices)


def test_no_advice_when_nothing_fits():
    # Even ZeRO-Infinity gathers the largest layer (the 1.25 B-parameter embedding) whole: 4.6 GiB > 4 GiB.
    assert (
        advise(
            recipe_of("recipe=qwen2.5_72b_sft", "hw=cpu", "cluster=local", "hw.memory_gib=4"),
            IMAGES,
            parallel_options=OPTIONS,
        )
        == []
    )


def test_advice_prefers_no_checkpointing_when_memory_allows():
    best = advice_for(("recipe=qwen2.5_14b_sft",))[0]
    assert "parallel.gradient_checkpointing=false" in best.overrides
    assert best.estimate.compute.recompute_factor == 1.0


def test_tp_pp_search_respects_pipeline_zero_limit_and_reproduces():
    base = ("recipe=llama3_70b_sft",)
    advices = advice_for(base, True)
    assert advices
    for advice in advices:
        est = advice.estimate
        assert est.fits
        d = est.parallel3d
        if d is not None:
            assert est.parallel.zero_stage <= (1 if d.pipeline_parallel > 1 else 2)
            assert d.tp_inside_node
            # a pipeline is proposed with the engine that builds it, and said to run in the bundle where it does
            assert ("engine=megatron" in advice.overrides) == (d.pipeline_parallel > 1)
            assert ("analysis only" in d.note) == (not advice.buildable)
            if d.pipeline_parallel > 1 and advice.buildable:
                assert "Megatron-core" in d.note
        recipe = recipe_of(*base, *advice.overrides)
        assert recipe == est.recipe
        assert make_plan(recipe, IMAGES, analysis_only=True).summary() == est.plan.summary()


def test_candidate_carries_the_users_parallel_settings():
    recipe = recipe_of("recipe=qwen2.5_14b_sft", "parallel.reduce_bucket_size=100000000")
    cand = candidate(
        recipe, OPTIONS, parallel="zero2", gradient_checkpointing=True, micro_batch_size=2, global_batch_size=64
    )
    assert cand.recipe.parallel.reduce_bucket_size == 100_000_000
    assert cand.recipe.parallel.name == "zero2" and cand.recipe.parallel.zero_stage == 2
    assert cand.overrides == ("parallel=zero2", "train.micro_batch_size=2")


def test_candidate_rewrites_a_layout_key_the_recipe_overrode():
    base = ("recipe=qwen2.5_14b_sft", "parallel.zero_stage=2")
    cand = candidate(recipe_of(*base), OPTIONS, parallel="zero1", global_batch_size=64)
    assert "parallel.zero_stage=1" in cand.overrides
    assert recipe_of(*base, *cand.overrides) == cand.recipe


def test_render_and_dict():
    from rich.console import Console

    advices = advice_for(("recipe=qwen2.5_14b_sft",))
    console = Console(width=200, record=True, color_system=None)
    console.print(render_advice(advices))
    shown = console.export_text()
    assert "Layouts that fit" in shown
    assert " ".join(advices[0].overrides) in "\n".join(advice_lines(advices))
    data = advice_dict(advices)
    assert data[0]["overrides"] == list(advices[0].overrides) and data[0]["estimate"]["memory_gib"]["fits"]


def test_build_suggests_fixes_from_the_team_recipe_trees_too(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A team's own parallel options (`--recipes DIR`) are candidates for the fix a refused build proposes."""
    from recipekit.base.errors import RecipeError
    from recipekit.bundle import build

    team = tmp_path / "team"
    (team / "parallel").mkdir(parents=True)
    own = (ROOT / "recipes" / "parallel" / "zero3_offload.yaml").read_text()
    (team / "parallel" / "zero3_offload_team.yaml").write_text(own.replace("zero3_offload", "zero3_offload_team"))
    seen: list[tuple[Path, ...]] = []
    real = load_parallel_options

    def spy(extra_dirs=()):
        seen.append(tuple(extra_dirs))
        return real(extra_dirs)

    monkeypatch.setattr(build, "load_parallel_options", spy)
    resolved = build.resolve(["recipe=llama3_70b_sft", "cluster.nodes=1"], [team])
    with pytest.raises(RecipeError, match="cheapest change that fits"):
        build.compile_bundle(resolved)
    assert seen == [(team,)]
    assert "zero3_offload_team" in spy((team,))


def test_candidates_are_planned_without_documents_but_with_every_number():
    """A plan holds numbers only: no Job or ds_config is built for a candidate advise tries (the documents are built
    once, for the bundle), and planning is deterministic, so equal recipes plan and estimate equal."""
    recipe = recipe_of("recipe=qwen2.5_14b_sft")
    first = make_plan(recipe, IMAGES, analysis_only=True)
    again = make_plan(recipe, IMAGES, analysis_only=True)
    assert first.summary() == again.summary() and first.image
    assert not {"job", "launch", "ds_config", "training_arguments", "env"} & set(vars(first))
    assert estimate(recipe, first) == estimate(recipe, again)


def test_equally_fast_layouts_rank_by_headroom_and_the_first_says_why():
    """Issue 41: the paste line picked the tightest of equally fast layouts (DDP at 58.9 of 64 GiB over an equally
    fast ZeRO-3 at 34.1). Steps shown alike tie; among them more headroom comes first (then fewer devices, then the
    simpler layout), and the plan says why the first is first."""
    from recipekit.memory import why_first

    advices = list(advice_for(("recipe=llama3_8b_lora",)))
    tied = [a for a in advices if shown_step(a.step_time_s) == shown_step(advices[0].step_time_s)]
    assert len(tied) > 1
    assert advices[0].estimate.headroom_gib == max(a.estimate.headroom_gib for a in tied)
    for first, second in zip(advices, advices[1:]):
        if shown_step(first.step_time_s) == shown_step(second.step_time_s):
            assert round(first.estimate.headroom_gib, 1) >= round(second.estimate.headroom_gib, 1)
    assert why_first(advices).startswith("1 is first: as fast as 2, with more headroom")
