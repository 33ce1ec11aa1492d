"""The ``recipekit`` command: parse arguments, call one library function, print. No decisions live here.

Exit codes: 0 success; 1 a check failed (validate: a check failed; plan: DOES NOT FIT; compare: NOT ALIGNED; diff:
the bundles differ; submit: the API server, Volcano's admission webhook or a missing Secret, claim, account or
priority class refused the run, and nothing was created; status: the run's Job ended without completing — Failed,
Aborted, Terminated; logs: the pod has no log yet); 2 the input (recipe, overrides, bundle path, kubeconfig, context,
a run or pod that does not exist) is unusable — with one line per problem and never a traceback; 3 `compare` could
not tell (INCONCLUSIVE: too few common steps, the learning rate still warming up, a loss that moved less than the
tolerance, or noise larger than it); 4 the cluster could not be asked (submit, status, logs, cancel: the API server
is unreachable, refused the credentials, or refused to show the run); 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import gc
import sys

import click

from recipekit import __version__
from recipekit.cli.common import SETTINGS


class _Context(click.Context):
    """recipekit's click context: its help breaks lines between words only, never at a hyphen inside one
    (:func:`recipekit.cli.terminal.help_formatter`)."""

    def make_formatter(self) -> click.HelpFormatter:
        from recipekit.cli.terminal import help_formatter

        formatter: click.HelpFormatter = help_formatter()(width=self.terminal_width, max_width=self.max_content_width)
        return formatter


def _with_context(command: click.Command) -> click.Command:
    """``command`` and every command under it made with :class:`_Context`."""
    command.context_class = _Context
    for sub in getattr(command, "commands", {}).values():
        _with_context(sub)
    return command


class _Commands(click.Group):
    """A group whose heavier commands are imported only when invoked, so `build` does not pay for `validate`."""

    context_class = _Context

    lazy = {
        "build": ("recipekit.cli.build", "build"),
        "show": ("recipekit.cli.build", "show"),
        "plan": ("recipekit.cli.build", "plan"),
        "list": ("recipekit.cli.listing", "list_"),
        "validate": ("recipekit.cli.validate", "validate_command"),
        "clean": ("recipekit.cli.validate", "clean_command"),
        "init": ("recipekit.cli.handover", "init_command"),
        "pack": ("recipekit.cli.handover", "pack_command"),
        "verify": ("recipekit.cli.handover", "verify_command"),
        "diff": ("recipekit.cli.handover", "diff_command"),
        "image": ("recipekit.cli.image", "image_group"),
        "data": ("recipekit.cli.data", "data_group"),
        "model": ("recipekit.cli.model", "model_group"),
        "report": ("recipekit.cli.run.report", "report_command"),
        "runs": ("recipekit.cli.run.runs", "runs_group"),
        "compare": ("recipekit.cli.run.report", "compare_command"),
        "rescale": ("recipekit.cli.run.rescale", "rescale_command"),
        "submit": ("recipekit.cli.run.cluster", "submit_command"),
        "status": ("recipekit.cli.run.cluster", "status_command"),
        "logs": ("recipekit.cli.run.cluster", "logs_command"),
        "cancel": ("recipekit.cli.run.cluster", "cancel_command"),
        "cp": ("recipekit.cli.handover", "cp_command"),
        "restart": ("recipekit.cli.run.restart", "restart_command"),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def invoke(self, ctx: click.Context) -> object:
        """Ctrl-C ends any command with 130 (128 + SIGINT) and one line, as a shell expects, not click's
        "Aborted!" and 1, which reads as a failed check."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """click suggests a close command name from the commands loaded so far; the lazy ones count too
        (``recipekit bulid``: did you mean 'build'?)."""
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as exc:
            raise click.exceptions.NoSuchCommand(
                exc.command_name, possibilities=self.list_commands(ctx), ctx=ctx
            ) from None

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy and name not in self.commands:
            import importlib

            module, attribute = self.lazy[name]
            self.add_command(_with_context(getattr(importlib.import_module(module), attribute)), name)
        return super().get_command(ctx, name)


@click.group(cls=_Commands, context_settings=SETTINGS)
@click.version_option(__version__, prog_name="recipekit")
def main() -> None:
    """Compile a training recipe into a Volcano launch bundle for Ascend NPU and NVIDIA GPU clusters.

    Recipes are chosen and changed with Hydra overrides: group=option, key=value, +key=value (a new key),
    ~key (delete).

    \b
    Examples:
      recipekit list
      recipekit build recipe=llama3_8b_sft hw=ascend910b
      recipekit plan recipe=llama3_70b_sft cluster.nodes=8 --advise
      recipekit validate bundles/llama3_8b_sft --dry-run
      recipekit image build bundles/tiny_sft --push  # needs a Docker-API engine
    """


def run() -> None:
    """The console script: :func:`main`, then skip the interpreter's last garbage collection.

    At exit CPython collects every cycle left by Hydra, OmegaConf, ANTLR and Jinja; measured here that is about
    0.15 s — a fifth of a whole `build`. Freezing the heap leaves those objects to the operating system, which
    reclaims the memory at once. Everything that must happen at exit still does: objects are released by reference
    counting, atexit handlers run, streams are flushed; nothing recipekit writes is pending by then.
    """
    try:
        main()
    finally:
        gc.freeze()


if __name__ == "__main__":  # pragma: no cover
    run()
