"""Team recipe repos: init scaffolds one that builds and passes its own CI; layers shadow built-ins; list shows it;
recipekit.toml's version range is enforced; a bad team YAML is reported with file, line and key; the manifest
records where the team recipes came from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit import __version__
from recipekit.base.errors import RecipeError
from recipekit.cli import main
from recipekit.cli.listing import option_rows
from recipekit.recipe.compose import compose
from recipekit.recipe.team import search_layers, version_range

SRC = Path(__file__).resolve().parents[3] / "src"


def run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, list(args), env={"COLUMNS": "200", **(env or {})})


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A freshly scaffolded team repo, entered (recipekit.toml is found from the current directory)."""
    assert run("init", str(tmp_path / "team-nlp-recipes")).exit_code == 0
    monkeypatch.chdir(tmp_path / "team-nlp-recipes")
    return tmp_path / "team-nlp-recipes"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_init_then_build_from_a_clean_directory(repo: Path) -> None:
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()) == [
        ".gitignore",
        "README.md",
        "ci.sh",
        "recipekit.toml",
        "recipes/cluster/team.yaml",
        "recipes/model/our_qwen2.5_7b.yaml",
        "recipes/recipe/our_qwen_sft.yaml",
    ]
    assert f'recipekit = "{version_range()}"' in (repo / "recipekit.toml").read_text()
    assert os.access(repo / "ci.sh", os.X_OK)
    result = run("build", "recipe=our_qwen_sft")
    assert result.exit_code == 0, result.output
    manifest = json.loads((repo / "bundles" / "our_qwen_sft" / "manifest.json").read_text())
    assert manifest["choices"]["cluster"] == "team" and manifest["recipe"]["cluster"]["queue"] == "team-nlp-recipes"
    assert manifest["recipe"]["model"]["name_or_path"] == "/mnt/team/models/Qwen2.5-7B-Instruct"
    assert manifest["origin"] == [
        {
            "path": str(repo.resolve() / "recipes"),
            "repo": "team-nlp-recipes",
            "repo_path": str(repo.resolve()),
            "git_commit": None,
            "git_dirty": None,
        }
    ]


def test_init_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep").write_text("mine")
    result = run("init", str(tmp_path / "x"))
    assert result.exit_code == 2 and "already exists and is not empty" in result.output
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["keep"]


def test_scaffold_ci_script_passes(repo: Path) -> None:
    env = {**os.environ, "RECIPEKIT": f"{sys.executable} -m recipekit.cli", "PYTHONPATH": str(SRC)}
    env.pop(("RECIPEKIT_RECIPES"), None)
    result = subprocess.run(["bash", "ci.sh"], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 combination: 1 built, 0 failed" in result.stdout
    assert "our_qwen_sft" in result.stdout


def test_git_checkout_origin_has_commit_and_dirty_flag(repo: Path) -> None:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "recipes"], cwd=repo, check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert run("build", "recipe=our_qwen_sft").exit_code == 0
    origin = json.loads((repo / "bundles/our_qwen_sft/manifest.json").read_text())["origin"][0]
    assert (origin["git_commit"], origin["git_dirty"]) == (commit, False)
    first = (repo / "bundles/our_qwen_sft/manifest.json").read_bytes()
    assert run("build", "recipe=our_qwen_sft").exit_code == 0
    assert (repo / "bundles/our_qwen_sft/manifest.json").read_bytes() == first, "same checkout, same bytes"
    (repo / "ci.sh").write_text("# edited outside the recipe tree\n")
    write(repo / "recipes" / "data" / "ours.yaml", "name: ours\n")
    assert run("build", "recipe=our_qwen_sft").exit_code == 0
    assert json.loads((repo / "bundles/our_qwen_sft/manifest.json").read_text())["origin"][0]["git_dirty"] is True


def test_team_option_shadows_a_builtin_one_and_list_marks_it(repo: Path) -> None:
    write(
        repo / "recipes" / "cluster" / "default.yaml", "defaults:\n  - local\n  - _self_\nname: default\nqueue: ours\n"
    )
    composed = compose(["cluster=default"], extra_dirs=[repo / "recipes"])
    assert composed.raw["cluster"]["queue"] == "ours"
    assert (
        composed.raw["cluster"]["memory_gib_per_pod"] == compose(["cluster=local"]).raw["cluster"]["memory_gib_per_pod"]
    )
    result = run("list", "cluster")
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") >= 3}
    assert "default *" in rows and "team-nlp-recipes (shadows built-in)" in rows["default *"]
    assert "team-nlp-recipes" in rows["team"] and "shadows" not in rows["team"]
    assert "built-in" in rows["local"]


def test_later_layers_override_earlier_ones(repo: Path, tmp_path: Path) -> None:
    """recipekit.toml's trees, then --recipes in order, then $RECIPEKIT_RECIPES: the last one wins."""
    # the team options mount the volume where the team repo's model and data live (/mnt/team)
    option = "defaults:\n  - default\n  - _self_\nname: team\nqueue: {}\n"
    option += "mount_path: /mnt/team\noutput_dir: /mnt/team/runs\n"
    flag, env = tmp_path / "flag", tmp_path / "env"
    write(flag / "cluster" / "team.yaml", option.format("from-flag"))
    write(env / "cluster" / "team.yaml", option.format("from-env"))
    assert [layer.label for layer in search_layers([flag], environ={"RECIPEKIT_RECIPES": str(env)})] == [
        "team-nlp-recipes",
        f"--recipes {flag}",
        f"RECIPEKIT_RECIPES {env}",
    ]
    shown = run("show", "recipe=our_qwen_sft", "--json", "--recipes", str(flag))
    assert json.loads(shown.output)["recipe"]["cluster"]["queue"] == "from-flag"
    shown = run("show", "recipe=our_qwen_sft", "--json", "--recipes", str(flag), env={"RECIPEKIT_RECIPES": str(env)})
    assert json.loads(shown.output)["recipe"]["cluster"]["queue"] == "from-env"
    layers = search_layers([flag], environ={"RECIPEKIT_RECIPES": str(env)})
    (team,) = [row for row in option_rows(["cluster"], layers) if row.option == "team"]
    assert (team.origin, team.shadows) == (f"RECIPEKIT_RECIPES {env}", ("team-nlp-recipes", f"--recipes {flag}"))


def test_a_team_root_config_changes_the_defaults(repo: Path) -> None:
    builtin = (Path(__file__).resolve().parents[3] / "recipes" / "config.yaml").read_text()
    write(repo / "recipes" / "config.yaml", builtin.replace("cluster: default", "cluster: team"))
    assert compose([], extra_dirs=[repo / "recipes"]).choices["cluster"] == "team"
    assert "team *" in run("list", "cluster").output


def test_a_recipekit_version_outside_the_range_is_refused(repo: Path) -> None:
    toml = repo / "recipekit.toml"
    toml.write_text(toml.read_text().replace(version_range(), ">=99.0,<100"))
    result = run("build", "recipe=our_qwen_sft")
    assert result.exit_code == 2
    assert f"this repo is written for recipekit >=99.0,<100; this is recipekit {__version__}" in result.output
    assert "Traceback" not in result.output and not (repo / "bundles").exists()
    assert run("list").exit_code == 2


def test_recipekit_toml_problems_name_the_key(repo: Path) -> None:
    (repo / "recipekit.toml").write_text('name = "x"\nrecipekit = "soon"\nsearch_path = ["nope"]\nowner = "me"\n')
    result = run("show", "recipe=our_qwen_sft")
    assert result.exit_code == 2 and "3 problems" in result.output, result.output
    for key, message in [
        ("owner", "unknown key"),
        ("recipekit", "not a version range"),
        ("search_path", "'nope' is not a directory"),
    ]:
        assert f"recipekit.toml: {key}: {message}" in result.output
    (repo / "recipekit.toml").write_text("name = [\n")
    assert "not valid TOML" in run("show").output


def test_version_range_follows_the_current_version() -> None:
    assert version_range("0.1.0") == ">=0.1,<0.2"
    assert version_range("1.4.2") == ">=1.4,<2"


def test_team_yaml_not_matching_the_recipe_names_file_line_and_key(repo: Path) -> None:
    cluster = repo / "recipes" / "cluster" / "team.yaml"
    lines = cluster.read_text().splitlines()
    queue_line = next(i for i, line in enumerate(lines, start=1) if line.startswith("queue:"))
    cluster.write_text(cluster.read_text().replace("queue: team-nlp-recipes", "queue: 5\nqueu: oops"))
    preset = repo / "recipes" / "recipe" / "our_qwen_sft.yaml"
    epochs_line = next(i for i, line in enumerate(preset.read_text().splitlines(), start=1) if "epochs:" in line)
    preset.write_text(preset.read_text().replace("epochs: 2", "epochs: -2"))
    result = run("build", "recipe=our_qwen_sft")
    assert result.exit_code == 2
    assert f"recipes/cluster/team.yaml:{queue_line}: cluster.queue: must be a string (got 5)" in result.output
    assert "quote it to keep it as text: queue: '5'" in result.output
    assert f"recipes/cluster/team.yaml:{queue_line + 1}: cluster.queu: unknown key" in result.output
    assert f"recipes/recipe/our_qwen_sft.yaml:{epochs_line}: train.epochs: must be greater than 0" in result.output
    # set on the command line: the command line is named, never the file (issue 41)
    result = run("build", "recipe=our_qwen_sft", "train.epochs=-1", "cluster.queue=q")
    assert "  - command line: train.epochs: must be greater than 0" in result.output
    assert "recipes/cluster/team.yaml" in result.output  # queu is still the file's
    # a section's rule broken by a key the command line set: not the model file, which holds other keys
    result = run("build", "recipe=our_qwen_sft", "model.hidden_size=100")
    assert "  - command line: model: hidden_size (100) must be divisible" in result.output, result.output
    assert "recipes/model/" not in result.output


def test_a_missing_key_points_at_the_section_file(repo: Path) -> None:
    write(repo / "recipes" / "model" / "bare.yaml", "name: bare\nfamily: llama\n")
    with pytest.raises(RecipeError) as info:
        from recipekit.bundle.build import resolve

        resolve(["model=bare"], [repo / "recipes"])
    assert any(
        str(p).startswith("recipes/model/bare.yaml:1: model.num_layers: required key") for p in info.value.problems
    )


def test_missing_layers_are_reported(tmp_path: Path) -> None:
    result = run("build", "recipe=tiny_sft", env={"RECIPEKIT_RECIPES": str(tmp_path / "gone")})
    assert result.exit_code == 2 and f"RECIPEKIT_RECIPES {tmp_path / 'gone'}: not a directory" in result.output
