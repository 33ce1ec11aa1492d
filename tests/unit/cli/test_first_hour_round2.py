"""The first hour, round 2 (issue 32, point 9): the smaller things a new user met, each held to what it should be."""

from __future__ import annotations

from click.testing import CliRunner

from recipekit.cli import main


def test_ctrl_c_exits_130_from_any_command(monkeypatch) -> None:
    """The reference says 130 for Ctrl-C: every command, not only validate (click's own answer is 1, "Aborted!")."""
    import recipekit.bundle.build

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(recipekit.bundle.build, "resolve", interrupted)
    result = CliRunner().invoke(main, ["show", "recipe=tiny_sft"])
    assert result.exit_code == 130 and "interrupted" in result.output and "Aborted" not in result.output
