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


def test_the_substitution_list_is_short_and_its_counts_are_true() -> None:
    from recipekit.cli.validate import substitution_lines

    work = "/tmp/some/rather/long/work/directory/of/a/dry/run"

    def sub(field: str, old: object, new: object, why: str, derived: bool = False, file: str = "recipe.yaml"):
        return {"file": file, "field": field, "old": old, "new": new, "why": why, "derived": derived}

    subs = [
        sub("recipe.cluster.mount_path", "/mnt/shared", f"{work}/shared", "the PVC is a directory here"),
        sub("recipe.cluster.output_dir", "/mnt/shared/runs", f"{work}/shared/runs", "the PVC is a directory here"),
        sub("recipe.train.max_steps", 1000, 8, "a few steps"),
        sub("recipe.data.path", "/mnt/shared/" + "x" * 60 + ".jsonl", f"{work}/shared/data/tiny.jsonl", "tiny data"),
        *(sub(f"zero_optimization.k{i}", i, i + 1, "follows", True, "ds_config.json") for i in range(5)),
        *(sub(f"nodes{i}", i, i + 1, "follows", True, "launch.json") for i in range(2)),
    ]
    lines = substitution_lines(subs, work)
    assert lines[0].startswith("dry-run substitutions, 4 in the recipe (paths relative to " + work)
    assert lines[1] == (
        "  cluster.mount_path /mnt/shared → ./shared, cluster.output_dir /mnt/shared/runs → ./shared/runs: "
        "the PVC is a directory here"
    )
    assert lines[2] == "  train.max_steps 1000 → 8: a few steps"
    assert lines[3] == "  data.path: tiny data", "a value too long for the line is left out, not cut"
    assert lines[4] == "  and 7 values that follow from them when re-planned (ds_config.json 5, launch.json 2)"
    assert len(lines) == 5 and not any("…" in line for line in lines)


def test_the_op_builds_progress_only_moves_the_spinner() -> None:
    """The build's progress is one line a terminal rewrites: its messages never stay on screen one by one."""
    from recipekit.cli.validate import _transient
    from recipekit.validate.dryrun.options import BUILD_PROGRESS

    assert _transient(f"{BUILD_PROGRESS} deepspeed_shm_comm [1/3], 12 s")
    assert _transient("attempt 0: step 3")
    assert not _transient("building DeepSpeed's C++ ops (deepspeed_shm_comm) with g++ into /x — once per machine")


def test_a_step_s_loss_stays_in_the_scrollback() -> None:
    """Each logged step's loss is printed to stay (issue 32: the per-step loss lines vanished from the scrollback);
    a bare step, without its loss, only moves the spinner."""
    from recipekit.cli.validate import _transient

    assert not _transient("attempt 1: step 3/8, loss 5.1234")
    assert _transient("attempt 1: step 3")


def test_a_lost_node_is_any_pod_of_the_job_at_a_step_it_may_return_after() -> None:
    """--lose-pod: any pod, the first included (the rendezvous store lives in a pod of its own); the loss lands at
    the default kill step unless told; the capacity returns after it, with a step left for the grown run."""
    lost = DryRunOptions(pods=2, steps=10, lose_pod=1, return_at_step=8).resolved()
    assert (lost.at_step, lost.return_at_step) == (7, 8)
    assert DryRunOptions(pods=2, steps=10, lose_pod=0).resolved().lose_pod == 0
    refused = {
        "--lose-pod 2: pods 0..1": DryRunOptions(pods=2, lose_pod=2),
        "one drill per dry run": DryRunOptions(pods=2, lose_pod=1, kill_pod=1),
        "--return-at-step 9": DryRunOptions(pods=2, steps=10, lose_pod=1, return_at_step=9),
        "--return-at-step 6": DryRunOptions(pods=2, steps=10, lose_pod=1, at_step=6, return_at_step=6),
        "--return-at-step needs --lose-pod": DryRunOptions(pods=2, return_at_step=5),
    }
    for message, options in refused.items():
        with pytest.raises(DryRunUsageError, match=message):
            options.resolved()
