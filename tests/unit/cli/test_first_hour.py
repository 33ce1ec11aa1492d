"""What a new user meets in the first hour (issue 19): slips said plainly, every problem at once, bundles whose
README agrees with their files, paths on a mounted volume, OOM bundles flagged, paste lines that paste."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.cli import main
from tests.conftest import render_files

SEED_OOM = ["recipe=qwen2.5_14b_sft", "hw=ascend910b", "cluster.nodes=2", "parallel=zero2", "train.micro_batch_size=4"]


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def problems(output: str) -> list[str]:
    return [line[4:] for line in output.splitlines() if line.startswith("  - ")]


# ------------------------------------------------------------------------------------------------ 5: slips
@pytest.mark.parametrize(
    ("arguments", "meant"),
    [
        (["recipe=llama3_8b_sft", "--nodes", "2"], "cluster.nodes=2"),
        (["recipe=llama3_8b_sft", "--nodes=2"], "cluster.nodes=2"),
        (["recipe=llama3_8b_sft", "--micro-batch-size", "4"], "train.micro_batch_size=4"),
        (["llama3_8b_sft"], "recipe=llama3_8b_sft"),
        (["recipe=llama3_8b_sft", "zero3"], "parallel=zero3"),
    ],
)
def test_a_command_line_slip_says_what_was_meant(arguments: list[str], meant: str, tmp_path: Path) -> None:
    result = run("build", *arguments, "-o", str(tmp_path / "b"))
    assert result.exit_code == 2, result.output
    assert meant in result.output
    assert "Exception" not in result.output and "EQUAL" not in result.output and "Traceback" not in result.output


def test_an_unknown_flag_matching_no_key_is_named(tmp_path: Path) -> None:
    result = run("build", "recipe=llama3_8b_sft", "--frobnicate", "-o", str(tmp_path / "b"))
    assert result.exit_code == 2 and "--frobnicate" in result.output and "Exception" not in result.output


# ------------------------------------------------------------------------------------------------ 6: every problem
def test_every_independent_problem_is_reported() -> None:
    result = run("show", "data=jsonl", "train.learning_rate=-1", "train.micro_batch_size=0")
    assert result.exit_code == 2
    found = problems(result.output)
    assert len(found) == 3, found
    assert any(p.startswith("data: unknown option 'jsonl'") for p in found)
    assert any(p.startswith("train.learning_rate") for p in found)
    assert any(p.startswith("train.micro_batch_size") for p in found)


def test_no_problem_that_follows_from_another() -> None:
    result = run("show", "recipe=qwen2.5_14b_sft", "parallel.tensor_parallel=3")
    assert result.exit_code == 2
    assert problems(result.output) == [
        p for p in problems(result.output) if p.startswith("parallel.tensor_parallel")
    ], result.output
    assert "data-parallel size (5)" not in result.output


# ------------------------------------------------------------------------------------------------ 9: how to unset
def test_both_batch_keys_set_says_how_to_unset_one() -> None:
    result = run("show", "recipe=llama3_8b_sft", "train.gradient_accumulation_steps=4")
    assert result.exit_code == 2
    assert "train.global_batch_size=null" in result.output
    # and that advice works
    fixed = run("show", "recipe=llama3_8b_sft", "train.gradient_accumulation_steps=4", "train.global_batch_size=null")
    assert fixed.exit_code == 0, fixed.output


# ------------------------------------------------------------------------------------------------ 2: volumes
def test_default_paths_follow_the_mount_path() -> None:
    result = run("show", "recipe=llama3_8b_sft", "cluster.mount_path=/mnt/data", "--json")
    assert result.exit_code == 0, result.output
    recipe = json.loads(result.output)["recipe"]
    assert recipe["model"]["name_or_path"].startswith("/mnt/data/")
    assert recipe["data"]["path"].startswith("/mnt/data/")
    assert recipe["cluster"]["output_dir"].startswith("/mnt/data/")


def test_build_refuses_paths_on_no_volume(tmp_path: Path) -> None:
    result = run(
        "build",
        "recipe=llama3_8b_sft",
        "cluster.mount_path=/mnt/data",
        "model.name_or_path=/mnt/shared/models/Meta-Llama-3-8B",
        "data.path=/mnt/shared/data/alpaca.jsonl",
        "-o",
        str(tmp_path / "b"),
    )
    assert result.exit_code == 2, result.output
    assert "model.name_or_path" in result.output and "data.path" in result.output and "/mnt/data" in result.output
    assert not (tmp_path / "b").exists()


def test_a_hub_id_or_a_path_on_the_volume_builds() -> None:
    result = run("show", "recipe=llama3_8b_sft", "model.name_or_path=meta-llama/Meta-Llama-3-8B", "--json")
    assert result.exit_code == 0, result.output


# ------------------------------------------------------------------------------------------------ 3: --allow-oom
def test_an_oom_bundle_says_so_at_the_top_of_its_readme() -> None:
    readme = render_files(SEED_OOM, allow_oom=True)["README.md"].decode()
    head = "\n".join(readme.splitlines()[:6])
    assert "DOES NOT FIT" in head and "74.7 GiB" in head and "64 GiB" in head
    fitting = render_files(["recipe=qwen2.5_14b_sft"])["README.md"].decode()
    assert "DOES NOT FIT" not in fitting


def test_validate_warns_about_an_oom_bundle(tmp_path: Path) -> None:
    from recipekit.bundle.build import build
    from recipekit.validate import validate

    built = build(SEED_OOM, tmp_path / "b", allow_oom=True)
    report = validate(built.path, libraries=False)
    assert any("74.7 GiB" in w and "64 GiB" in w for w in report.warnings), report.warnings
    assert report.to_json()["warnings"] == report.warnings


def test_validate_verdict_line_carries_the_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from recipekit.cli.validate import print_verdict
    from recipekit.validate.shared.results import Verdict

    report = Verdict("b", warnings=["does not fit: 74.7 GiB per device predicted"])
    print_verdict(report)
    out = capsys.readouterr().out
    assert "warning: does not fit: 74.7 GiB per device predicted" in out


# ------------------------------------------------------------------------------------------------ 4: README agrees
def test_readme_summary_comes_from_the_resolved_recipe() -> None:
    readme = render_files(["recipe=qwen2.5_14b_sft", "parallel=zero2"])["README.md"].decode()
    summary = readme.split("\n\n")[1]
    assert "ZeRO-3" not in summary and "ZeRO-2" in summary, summary
    assert "qwen2.5" in summary and "2 pods" in summary and "DOES NOT FIT" not in readme


def test_readme_never_asks_to_edit_volcano_job() -> None:
    readme = render_files(["recipe=tiny_sft"])["README.md"].decode()
    assert "in volcano-job.yaml yourself" not in readme
    assert "recipekit image build . --push" in readme


# ------------------------------------------------------------------------------------------------ 9: small ones
def test_team_readme_names_the_packages_bundle_folder() -> None:
    text = (Path(__file__).resolve().parents[3] / "templates/init/README.md").read_text()
    assert "`bundle/volcano-job.yaml`" not in text and "`our_qwen_sft/bundle/volcano-job.yaml`" in text


def test_advise_paste_line_has_each_key_once() -> None:
    result = run("plan", "recipe=qwen2.5_14b_sft", "parallel=zero2", "--advise")
    assert result.exit_code == 0, result.output
    paste = next(line for line in result.output.splitlines() if line.startswith("paste:"))
    keys = [word.split("=")[0].lstrip("+~") for word in paste.split()[3:]]
    assert len(keys) == len(set(keys)), paste


def test_merge_overrides_keeps_the_last_of_each_key() -> None:
    from recipekit.recipe.overrides import merge

    assert merge(["recipe=a", "parallel=zero2", "train.x=1"], ["parallel=zero3", "~train.x"]) == [
        "recipe=a",
        "parallel=zero3",
        "~train.x",
    ]


def test_image_build_without_engine_says_it_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from recipekit.bundle.build import build

    built = build(["recipe=tiny_sft"], tmp_path / "b")
    monkeypatch.setattr("shutil.which", lambda name, *a, **k: "/usr/bin/podman" if name == "podman" else None)
    result = run("image", "build", str(built.path), "--engine", f"unix://{tmp_path}/none.sock")
    assert result.exit_code == 2
    assert "Connection aborted" not in result.output and "FileNotFoundError" not in result.output
    assert f"no socket at {tmp_path}/none.sock" in result.output
    assert "podman system service" in result.output


def test_data_prepare_on_a_volume_path_suggests_volume(tmp_path: Path) -> None:
    from recipekit.bundle.build import build

    built = build(["recipe=tiny_sft", "cluster.mount_path=/nonexistent-volume-i19"], tmp_path / "b")
    result = run("data", "prepare", str(built.path))
    assert result.exit_code == 2, result.output
    assert "--volume" in result.output and "/nonexistent-volume-i19" in result.output


# ------------------------------------------------------------------------------------------------ show
def test_show_compact_is_one_key_a_line() -> None:
    result = run("show", "recipe=qwen2.5_14b_sft", "--compact")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()  # what was left out is said on stderr
    assert "train.micro_batch_size=1" in lines and "cluster.nodes=2" in lines and "parallel.zero_stage=3" in lines
    assert all(re.match(r"^[a-z_]+(\.[a-z0-9_]+)*=", line) for line in lines), lines[:5]
    assert len(lines) == len({line.split("=")[0] for line in lines})


def test_show_prints_yaml_lines_whole() -> None:
    result = run("show", "recipe=qwen2.5_14b_sft")
    assert result.exit_code == 0, result.output
    assert "description: Full SFT of Qwen2.5 14B on 2 nodes x 8 devices, ZeRO-3 with gradient checkpointing" in (
        result.output
    )
