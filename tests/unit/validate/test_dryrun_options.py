"""The dry run's options: one frozen record, resolved once, and the one home of the CLI's --dry-run flags."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from recipekit.cli.validate import validate_command
from recipekit.validate.dryrun.options import DryRunOptions, DryRunUsageError, flag_name, flags


def test_check_changes_nothing_and_resolving_fills_in_the_kill_step_once() -> None:
    options = DryRunOptions(pods=2, steps=8, kill_pod=1)
    options.check()
    assert options.at_step is None, "check() must not change the options"
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.at_step = 3  # type: ignore[misc]
    resolved = options.resolved()
    assert resolved.at_step == options.default_at_step == 6
    assert resolved.resolved() is resolved
    assert DryRunOptions(kill_pod=0, at_step=3).resolved().at_step == 3


@pytest.mark.parametrize(
    "options, message",
    [
        (DryRunOptions(pods=0), "--pods 0: must be between 1 and 16"),
        (DryRunOptions(steps=1), "--steps 1"),
        (DryRunOptions(timeout=float("nan")), "--timeout: nan is not a number"),
        (DryRunOptions(device="tpu"), "--device tpu: one of"),
        (DryRunOptions(at_step=3), "--at-step needs --kill-pod"),
        (DryRunOptions(kill_pod=2), "--kill-pod 2: pods are numbered 0..1"),
        (DryRunOptions(kill_pod=1, at_step=8), "--at-step 8"),
        (DryRunOptions(kill_pod=1, resume_pods=2), "--resume-pods 2: not --pods (2)"),
    ],
)
def test_options_out_of_range_or_contradicting_are_refused(options: DryRunOptions, message: str) -> None:
    with pytest.raises(DryRunUsageError) as refused:
        options.resolved()
    assert message in str(refused.value)


def test_the_cli_flags_are_generated_from_the_fields() -> None:
    params = {p.name: p for p in validate_command.params}
    for option in flags():
        param = params[option.name]
        assert param.opts == ["--" + flag_name(option.name)]
        assert param.default == option.default
        assert getattr(param, "help", None) == option.metadata["flag"].help
    assert "grace" not in params, "a field without a flag is not an option"


def test_the_cli_refuses_a_nan_timeout_in_one_line(tmp_path) -> None:
    result = CliRunner().invoke(validate_command, [str(tmp_path), "--dry-run", "--timeout", "nan"])
    assert result.exit_code == 2 and "--timeout: nan is not a number" in result.output
    assert "Traceback" not in result.output
