"""Matrix builds: Hydra's sweep syntax, one bundle per combination (byte-identical to a single build), a failing
combination reported while the rest build, a summary table, and compositions shared between combinations."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from recipekit.base.errors import RecipeError
from recipekit.bundle import sweep as matrix
from recipekit.bundle.files import read_files
from recipekit.bundle.sweep import combinations, run_matrix
from recipekit.cli import main
from recipekit.recipe import compose as compose_module


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_a_3x2_matrix_builds_6_bundles_with_a_summary(tmp_path: Path) -> None:
    result = run(
        "build", "-m", "recipe=tiny_sft,llama3_8b_lora,qwen2.5_7b_pretrain", "hw=ascend910b,h100", "-o", str(tmp_path)
    )
    assert result.exit_code == 0, result.output
    built = sorted(p.name for p in tmp_path.iterdir())
    assert built == sorted(
        f"{r}@{h}" for r in ("tiny_sft", "llama3_8b_lora", "qwen2.5_7b_pretrain") for h in ("ascend910b", "h100")
    )
    assert all((tmp_path / name / "manifest.json").is_file() for name in built)
    lines = result.output.splitlines()
    assert lines[0].split() == ["combination", "result", "devices", "plan", "fit"]
    assert "recipe=qwen2.5_7b_pretrain hw=h100" in result.output and "4×8 = 32" in result.output
    count = lines.index("6 combinations: 6 built, 0 failed")
    # then the images the bundles need: one per software stack, each named once
    listed = [line.strip() for line in lines[count + 2 :]]
    needed = {yaml.safe_load((tmp_path / name / "recipe.yaml").read_text())["plan"]["image"] for name in built}
    assert sorted(listed) == sorted(needed) and lines[count + 1].startswith(f"{len(needed)} images to build for 6")


def test_a_20_bundle_sweep_over_learning_rate_and_nodes_needs_one_image(tmp_path: Path) -> None:
    """The image holds the stack only: learning rate and node count are run files and Job, so 20 bundles name one
    image and the summary says so."""
    rates = ",".join(f"{k}e-5" for k in range(1, 11))
    result = run(
        "build", "-m", "recipe=tiny_sft", f"train.learning_rate={rates}", "cluster.nodes=1,2", "-o", str(tmp_path)
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "20 combinations: 20 built, 0 failed" in lines
    (head,) = [line for line in lines if " to build for " in line]
    assert head.startswith("1 image to build for 20 bundles")
    images = {yaml.safe_load((d / "recipe.yaml").read_text())["plan"]["image"] for d in tmp_path.iterdir()}
    jobs = {
        yaml.safe_load((d / "volcano-job.yaml").read_text())["spec"]["tasks"][0]["template"]["spec"]["containers"][0][
            "image"
        ]
        for d in tmp_path.iterdir()
    }
    assert len(images) == 1 and jobs == images and lines[-1] == f"  {images.pop()}"


def test_a_failing_combination_is_reported_and_the_rest_still_build(tmp_path: Path) -> None:
    """Llama 3 8B LoRA on a CPU node is deliberately invalid (it does not fit); the 5 others build."""
    result = run("build", "-m", "recipe=tiny_sft,llama3_8b_lora", "hw=ascend910b,h100,cpu", "-o", str(tmp_path))
    assert result.exit_code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "llama3_8b_lora@ascend910b",
        "llama3_8b_lora@h100",
        "tiny_sft@ascend910b",
        "tiny_sft@cpu",
        "tiny_sft@h100",
    ]
    assert "error: recipe=llama3_8b_lora hw=cpu:\n  - memory: needs" in result.output
    row = next(line for line in result.output.splitlines() if line.startswith("recipe=llama3_8b_lora hw=cpu "))
    assert "FAILED memory: needs" in row
    assert "6 combinations: 5 built, 1 failed" in result.output.splitlines()


def test_a_matrix_bundle_equals_the_single_build(tmp_path: Path) -> None:
    assert (
        run("build", "-m", "recipe=tiny_sft", "hw=cpu,h100", "train.seed=7,8", "-o", str(tmp_path / "m")).exit_code == 0
    )
    assert run("build", "recipe=tiny_sft", "hw=h100", "train.seed=8", "-o", str(tmp_path / "one")).exit_code == 0
    one = read_files(tmp_path / "one")[0]
    assert read_files(tmp_path / "m" / "tiny_sft@h100@train.seed=8")[0] == one


def test_combinations_sharing_group_choices_are_composed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, ...]] = []
    real = compose_module.compose_variants

    def counting(base, variants, extra_dirs=()):
        calls.append(tuple(base))
        return real(base, variants, extra_dirs)

    monkeypatch.setattr(matrix, "compose_variants", counting)
    outcomes = run_matrix(["recipe=tiny_sft", "hw=cpu,h100", "train.seed=1,2,3"], tmp_path, jobs=1)
    assert [o.ok for o in outcomes] == [True] * 6
    assert sorted(calls) == [("recipe=tiny_sft", "hw=cpu"), ("recipe=tiny_sft", "hw=h100")]


def test_output_names_and_shared_bases() -> None:
    found = combinations(["recipe=tiny_sft,llama3_8b_sft", "train.seed=1,2", "cluster.nodes=2"])
    assert [(c.recipe_option, c.suffix) for c in found] == [
        ("tiny_sft", "@train.seed=1"),
        ("tiny_sft", "@train.seed=2"),
        ("llama3_8b_sft", "@train.seed=1"),
        ("llama3_8b_sft", "@train.seed=2"),
    ]
    assert found[0].base == ("recipe=tiny_sft",) and found[0].tail == ("train.seed=1", "cluster.nodes=2")
    assert [c.recipe_option for c in combinations(["recipe=tiny_sft", "hw=cpu,h100"])] == [None, None]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["train.seed=interval(1,2)"], "train.seed: interval() is a continuous range"),
        (["hw=shuffle(cpu,h100)"], "hw: shuffle() gives a different order each run"),
        (["hw=cpu,h100", "hw=h200"], "hw: given twice in one sweep"),
        (["cluster.queue='a b','a_b'"], "would share its output directory"),
        (["train.seed=="], "override: Error parsing override"),
    ],
)
def test_an_unusable_sweep_builds_nothing(tmp_path: Path, arguments: list[str], message: str) -> None:
    with pytest.raises(RecipeError) as info:
        run_matrix(arguments, tmp_path / "out")
    assert message in str(info.value)
    assert not (tmp_path / "out").exists()
    result = run("build", "-m", *arguments, "-o", str(tmp_path / "out"))
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_glob_sweeps_a_groups_options() -> None:
    found = combinations(["recipe=glob(llama3_*)"])
    assert [c.overrides for c in found] == [
        ["recipe=llama3_70b_pretrain"],
        ["recipe=llama3_70b_sft"],
        ["recipe=llama3_8b_lora"],
        ["recipe=llama3_8b_sft"],
    ]


def test_shared_composition_equals_a_full_one() -> None:
    """Values applied to a shared composition give exactly what Hydra composes, for every kind of value override."""
    base = ["recipe=tiny_sft", "hw=h100"]
    tails = [
        ["train.seed=3"],
        ["train.learning_rate=1e-5", "cluster.queue='a b'"],
        ["train.report_to=[none]"],
        ["+train.extra=1"],
        ["~description"],
        ["train.max_steps=null", "cluster.nodes=4"],
        ["train.micro_bach_size=2"],  # unknown key: composed as compose() does; the schema reports it
    ]
    shared = compose_module.compose_variants(base, [([*base, *tail], tail) for tail in tails])
    for tail, composed in zip(tails, shared):
        assert composed == compose_module.compose([*base, *tail]), tail


def test_work_is_split_between_processes_only_where_it_pays() -> None:
    one_group = combinations(["recipe=tiny_sft", "train.seed=range(0,200)"])
    assert [len(piece) for piece in matrix._share(one_group, jobs=2)] == [25] * 8
    assert len(matrix._share(one_group, jobs=1)) == 1
    small = combinations(["recipe=tiny_sft,llama3_8b_sft", "train.seed=1,2,3"])
    assert [len(piece) for piece in matrix._share(small, jobs=2)] == [3, 3]
