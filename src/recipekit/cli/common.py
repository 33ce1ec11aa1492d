"""What every command shares: one click settings definition and one way to report unusable input (one line per
problem on stderr, exit code 2, never a traceback). Each command family's module imports these; none defines its own.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from recipekit.base.errors import RecipeError

SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


def rich_console(stderr: bool = False) -> Any:
    """rich, imported only by the commands that draw tables: it costs start-up time `build` need not pay. No markup
    in strings: names, paths and hints printed through it are shown as written (:mod:`recipekit.cli.terminal`)."""
    from recipekit.cli.terminal import console

    return console(stderr=stderr, soft_wrap=True)


def warn(warnings: list[str]) -> None:
    """Each warning on stderr, broken between words on a terminal (one line each when piped)."""
    from recipekit.cli.terminal import echo_wrapped

    for warning in warnings:
        echo_wrapped(f"{click.style('warning:', fg='yellow')} {warning}", err=True, terminal_only=True)


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn RecipeError into the list of problems on stderr and exit code 2.

    An ``OSError`` that reaches here (a ``--recipes`` tree that cannot be read, say) is the user's file system
    refusing a path they gave: it is reported the same way, one line naming the path, rather than as a traceback; a
    path that does not exist says which names beside it are close (:func:`recipekit.base.paths.did_you_mean`).
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except BrokenPipeError:  # stdout closed by the reader (| head): not the user's input
            raise
        except OSError as exc:
            from recipekit.base.errors import Problem
            from recipekit.base.paths import did_you_mean

            where = os.fsdecode(exc.filename) if exc.filename is not None else "path"
            reason = exc.strerror or str(exc)
            if isinstance(exc, FileNotFoundError) and exc.filename is not None:
                reason += did_you_mean(Path(where))  # a path the user mistyped: bundles/phi4-lora for phi4_lora
            exit_with_problems(RecipeError([Problem(where.encode("utf-8", "backslashreplace").decode(), reason)]))
        except RecipeError as err:
            exit_with_problems(err)

    return wrapper


def exit_with_problems(err: RecipeError) -> NoReturn:
    """Every problem on its own line on stderr, then exit code 2: the one way recipekit reports unusable input. On a
    terminal each is broken between words at its width (a terminal would cut a word), piped it is one line.

    One line each whatever text the input smuggled into a key or a message: control and invisible formatting
    characters are printed as their escapes (``\\n``, ``\\u202e``).
    """
    from recipekit.cli.terminal import echo_wrapped
    from recipekit.recipe.schema import printable

    count = len(err.problems)
    click.echo(f"{click.style('error:', fg='red', bold=True)} {count} problem{'s' if count != 1 else ''}:", err=True)
    for problem in err.problems:  # on a terminal broken between words; piped, one problem a line
        echo_wrapped(f"- {printable(str(problem))}", indent=2, err=True, terminal_only=True)
    sys.exit(2)


def fail(message: str) -> NoReturn:
    """One problem that is not a recipe key's (a path, a flag combination): one line on stderr, exit code 2."""
    from recipekit.cli.terminal import echo_wrapped
    from recipekit.recipe.schema import printable

    echo_wrapped(f"{click.style('error:', fg='red', bold=True)} {printable(message)}", err=True, terminal_only=True)
    sys.exit(2)


def finite(param: click.Parameter, value: float | None) -> float | None:
    """A number flag's value, refused when it is NaN (which every range comparison lets through)."""
    if value is not None and value != value:
        raise click.BadParameter("nan is not a number", param=param)
    return value


def recipes_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--recipes",
        "extra_dirs",
        multiple=True,
        type=click.Path(path_type=Path),
        help="Extra recipe tree searched after recipekit's own and recipekit.toml's, before $RECIPEKIT_RECIPES; "
        "a later tree overrides an earlier one; repeatable.",
    )(func)


def layers(extra_dirs: tuple[Path, ...]) -> tuple[Path, ...]:
    """Every team layer: recipekit.toml's search path (this directory or a parent), --recipes, $RECIPEKIT_RECIPES."""
    from recipekit.recipe.team import layer_dirs

    return layer_dirs(extra_dirs)
