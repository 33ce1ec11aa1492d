"""The first hour, round 3 (issue 41): did-you-mean for paths, commands and file kinds; the show, list and plan a
new user reads; the pod's requests and where they come from."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.cli import main


def run(*args: str) -> object:
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("paths")
    result = run("build", "recipe=tiny_sft", "-o", str(root / "bundles" / "phi4_lora"))
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture
def bundles(built: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(built)
    return built / "bundles"


@pytest.mark.parametrize(
    "command",
    [
        ["validate", "bundles/phi4-lora"],
        ["validate", "bundles/Phi4_Lora"],
        ["pack", "bundles/phi4-lora"],
        ["report", "bundles/phi4-lora"],
        ["image", "build", "bundles/phi4-lora"],
    ],
)
def test_a_mistyped_bundle_path_says_which_was_meant(bundles: Path, command: list[str]) -> None:
    result = run(*command)
    assert result.exit_code == 2 and "did you mean bundles/phi4_lora?" in result.output, result.output
    assert "Traceback" not in result.output


def test_a_file_where_a_bundle_belongs_says_what_to_do_with_it(bundles: Path) -> None:
    (bundles.parent / "x.tar.gz").write_bytes(b"")
    package = run("validate", "x.tar.gz")
    assert package.exit_code == 2 and "recipekit verify x.tar.gz" in package.output, package.output
    inside = run("validate", "bundles/phi4_lora/manifest.json")
    assert inside.exit_code == 2 and "recipekit validate bundles/phi4_lora" in inside.output, inside.output


def test_a_mistyped_command_says_which_was_meant() -> None:
    """`bulid` is close to `build`, a command imported only when invoked (click suggested only loaded ones)."""
    result = run("bulid")
    assert result.exit_code == 2 and "Did you mean 'build'?" in result.output, result.output


# ------------------------------------------------------------------------------------------------------ show
def test_show_prints_the_recipe_with_the_model_s_internals_behind_a_flag() -> None:
    """Issue 41: show printed 286 lines, most of them what model import measured. Now those are left out, said so
    in one line; --internals prints them; --json holds everything."""
    import json

    plain = run("show", "recipe=llama3_8b_sft")
    assert plain.exit_code == 0 and "num_layers: 32" in plain.output
    assert "train_per_position" not in plain.output and "rope_theta: 500000" not in plain.output.split("config")[-1]
    assert "# left out: model.params, flops, activations, modules, config (--internals)" in plain.output
    full = run("show", "recipe=llama3_8b_sft", "--internals")
    assert "train_per_position" in full.output and "# left out" not in full.output
    assert len(full.output.splitlines()) > len(plain.output.splitlines()) + 60
    compact = CliRunner().invoke(main, ["show", "recipe=llama3_8b_sft", "--compact"])
    assert "model.flops.train=" not in compact.stdout and "model.num_layers=32" in compact.stdout
    assert "model.flops.train=" in run("show", "recipe=llama3_8b_sft", "--compact", "--internals").output
    document = json.loads(run("show", "recipe=llama3_8b_sft", "--json").output)
    assert "flops" in document["recipe"]["model"]


# ------------------------------------------------------------------------------------------------------ list
def test_list_hides_the_test_twins_unless_asked() -> None:
    """Issue 41: six tiny_* test twins sat among the models a user chooses from."""
    shown = run("list")
    assert shown.exit_code == 0 and "llama3_8b *" in shown.output and "phi4" in shown.output
    assert "tiny_llama" not in shown.output and "tiny_sft" not in shown.output
    assert "7 test twins (tiny_*) not shown: --all" in shown.output
    everything = run("list", "model", "--all")
    assert "tiny_llama" in everything.output and "not shown" not in everything.output


# ------------------------------------------------------------------------------------------------------ plan
def test_plan_points_to_the_mfu_basis_instead_of_repeating_it() -> None:
    """Issue 41: every plan printed a 6-line "MFU basis" paragraph; it is defined once, in docs/models.md."""
    shown = run("plan", "recipe=llama3_8b_sft")
    assert shown.exit_code == 0, shown.output
    basis = [line for line in shown.output.splitlines() if "MFU basis" in line]
    assert len(basis) == 1 and "docs/models.md#flops-one-definition" in basis[0], basis
    assert "torch's FLOP counter over one forward" not in shown.output
    docs = Path(__file__).resolve().parents[3] / "docs" / "models.md"
    assert "### FLOPs: one definition" in docs.read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------------------- pod requests
def test_plan_build_and_readme_say_what_each_pod_requests_and_why(tmp_path: Path) -> None:
    """Issue 41: the pods asked for 172 CPUs and 870 GiB (the 910B option's assumed node) and nothing said so; a
    smaller node leaves the PodGroup Pending."""
    plan = run("plan", "recipe=qwen2.5_14b_sft")
    said = " ".join(plan.output.split())
    assert "pod requests: 172 CPU and 870 GiB of memory" in said, plan.output
    assert "90% of hw.node_cpus 192" in said and "85% of hw.node_memory_gib 1024" in said
    assert "cluster.cpu_per_pod" in said
    build = run("build", "recipe=qwen2.5_14b_sft", "cluster.memory_gib_per_pod=512", "-o", str(tmp_path / "b"))
    said = " ".join(build.output.split())
    assert build.exit_code == 0 and "each pod requests 172 CPU and 512 GiB of memory" in said, build.output
    assert "memory from cluster.memory_gib_per_pod" in said
    readme = (tmp_path / "b" / "README.md").read_text(encoding="utf-8")
    pending = readme.split("**PodGroup stays Pending.**")[1].split("\n- **")[0]
    assert "Each pod requests 172 CPU and 512 GiB of memory" in pending and "allocatable" in pending


def test_every_help_example_fits_80_columns() -> None:
    """Issue 41: 26 help-example lines ran to 118 characters; click prints them 4 columns in."""
    from tests.integration.test_help_examples import discover

    long = [example.line for example in discover() if len(example.line) + 4 > 80]
    assert not long, long
