"""The one way recipekit prints through rich: foreign text is never parsed as markup, and width is the terminal's.

Text that comes from a pod's log, a library's message, a user's path or a team's recipe may hold square brackets
(``[/__w/pytorch/third_party/gloo/pair.cc:553]``) that rich would read as a closing tag and raise ``MarkupError``
on. Everything that is not recipekit's own literal goes through :func:`plain`; recipekit's own styling is done with
``style=`` arguments, never with markup in an f-string. rich is imported lazily: ``build`` does not pay for it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text


def plain(text: object, style: str = "") -> Text:
    """``text`` as a rich Text shown exactly as written: no markup, no emoji codes, no highlighting."""
    from rich.text import Text

    return Text(str(text), style=style)


def styled(*parts: str | tuple[str, str]) -> Text:
    """A line of parts, each plain text or ``(text, style)``; what recipekit would otherwise write as markup."""
    from rich.text import Text

    return Text.assemble(*parts)


def console(*, stderr: bool = False, **options: Any) -> Console:
    """A Console that sizes itself to the terminal (80 columns when piped), never reads markup in strings printed
    through it, highlights nothing and shows no source-file column in ``log``."""
    from rich.console import Console

    settings: dict[str, Any] = {"highlight": False, "markup": False, "emoji": False, "log_path": False}
    return Console(stderr=stderr, **{**settings, **options})


def word_table(
    headers: list[str],
    rows: list[list[str]],
    *,
    title: str | None = None,
    caption: str | None = None,
    whole: tuple[int, ...] | None = None,
    width: int | None = None,
    drop: tuple[int, ...] = (),
    shorten: tuple[int, ...] = (),
) -> Any:
    """A table whose cells wrap between words, never inside one: every column is at least as wide as its longest
    word (an option name, a run directory, an image reference, a number). Where that is wider than ``width`` (the
    terminal's), the columns in ``drop`` are left out, in that order, until it fits (:func:`fitted_columns`); then
    the words of the columns in ``shorten`` (paths, image references) are shortened from the middle (``/mnt/…/x``),
    which keeps both ends a person recognises. Only a table that still cannot fit folds a word. The columns in
    ``whole`` never wrap at all. Every cell is plain text (:func:`plain`); the title and caption are lines of their
    own above and below, so no line ends in padding.
    """
    from rich.console import Group
    from rich.table import Table

    keep, rows = fitted_columns(headers, rows, width=width, drop=drop, shorten=shorten)
    table = Table()
    for i in keep:
        words = [word for text in [headers[i], *(row[i] for row in rows)] for word in text.split()]
        widest = max(map(len, words), default=1)
        no_wrap = whole is not None and i in whole
        table.add_column(plain(headers[i]), overflow="fold", min_width=widest, no_wrap=no_wrap)
    for row in rows:
        table.add_row(*(plain(row[i]) for i in keep))
    # title and caption as lines of their own: rich pads a table's own to the table's width (trailing spaces)
    return Group(*([plain(title)] if title else []), table, *([plain(caption)] if caption else []))


def fitted_columns(
    headers: list[str],
    rows: list[list[str]],
    *,
    width: int | None,
    drop: tuple[int, ...] = (),
    shorten: tuple[int, ...] = (),
) -> tuple[list[int], list[list[str]]]:
    """The columns a table of ``headers`` and ``rows`` keeps within ``width`` (each as wide as its longest word, plus
    a rich table's borders and padding: 3 a column and 1), leaving out those of ``drop`` in order; and the rows with
    the words of the ``shorten`` columns shortened from the middle where it still does not fit."""
    keep = list(range(len(headers)))

    def longest(i: int, cells: list[list[str]]) -> int:
        return max((len(w) for text in [headers[i], *(r[i] for r in cells)] for w in text.split()), default=1)

    def needed(cells: list[list[str]]) -> int:
        return sum(longest(i, cells) for i in keep) + 3 * len(keep) + 1

    if width is None:
        return keep, rows
    for column in drop:
        if needed(rows) <= width:
            break
        keep.remove(column)
    shortened = [i for i in shorten if i in keep]
    if needed(rows) > width and shortened:
        others = sum(longest(i, rows) for i in keep if i not in shortened) + 3 * len(keep) + 1
        room = max(12, (width - others) // len(shortened))
        rows = [
            [" ".join(middle(w, room) for w in cell.split()) if i in shortened else cell for i, cell in enumerate(row)]
            for row in rows
        ]
    return keep, rows


def middle(text: str, width: int) -> str:
    """``text`` within ``width`` characters, shortened from the middle (``registry.example.com/…/image:tag``): both
    ends stay, which is what a person matches a path or a reference by."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]


def echo_wrapped(
    text: str, *, indent: int = 0, err: bool = False, terminal_only: bool = False, hanging: int = 2
) -> None:
    """``text`` broken between words at the terminal's width (80 columns when piped), indented by ``indent``,
    its continuation lines ``hanging`` further: never a word cut, never a line the terminal wraps. A word longer
    than the line (a path) stays whole on a line of its own. ``terminal_only``: wrapped only where the stream is
    a terminal, so piped output keeps one record a line (an error a script greps)."""
    import shutil
    import sys
    import textwrap

    import click

    stream = sys.stderr if err else sys.stdout
    if terminal_only and not stream.isatty():
        click.echo(" " * indent + text, err=err)
        return
    width = max(40, shutil.get_terminal_size((80, 24)).columns)
    lead = " " * indent
    lines = textwrap.wrap(
        text,
        width=width,
        initial_indent=lead,
        subsequent_indent=lead + " " * hanging,
        break_long_words=False,
        break_on_hyphens=False,
    )
    click.echo("\n".join(lines) or lead, err=err)


def shown_path(path: object) -> str:
    """``path`` as a person typed it: relative to the working directory when it is below it, else as it is."""
    import os
    from pathlib import Path

    given = Path(str(path))
    try:
        here = Path.cwd()
    except OSError:  # a working directory that no longer exists
        return str(given)
    return os.path.relpath(given, here) if given.is_absolute() and given.is_relative_to(here) else str(given)


def wrap_paragraphs(
    text: str,
    width: int = 78,
    initial_indent: str = "",
    subsequent_indent: str = "",
    preserve_paragraphs: bool = False,
) -> str:
    """click's ``wrap_text`` (same arguments, same ``\\b`` paragraphs kept as written), but a line breaks only
    between words, never at a hyphen inside one (``re-sharded``, ``recipekit-report``, ``--dry-run``): what a person
    copies from a help page is the word as written."""
    import textwrap

    def fill(lines: list[str], first: str, rest: str) -> str:
        own = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
        return textwrap.fill(
            " ".join(" ".join(lines).split()),
            width=width,
            initial_indent=first + " " * own,
            subsequent_indent=rest + " " * own,
            break_on_hyphens=False,
            break_long_words=False,
        )

    if not preserve_paragraphs:
        return fill(text.splitlines(), initial_indent, subsequent_indent)
    paragraphs: list[str] = []
    for block in re.split(r"\n\s*\n", text.strip("\n")):
        lines = block.splitlines()
        first = initial_indent if not paragraphs else subsequent_indent
        if lines and lines[0].strip() == "\b":  # click's marker: keep the lines as written
            paragraphs.append("\n".join(subsequent_indent + line for line in lines[1:]))
        else:
            paragraphs.append(fill(lines, first, subsequent_indent))
    return "\n\n".join(paragraphs)


def help_formatter() -> type:
    """A click help formatter whose prose and option help break between words only (:func:`wrap_paragraphs`):
    click's own wraps at hyphens. Set as the ``formatter_class`` of recipekit's click contexts (cli/__init__.py)."""
    import contextlib

    import click
    import click.formatting

    @contextlib.contextmanager
    def words_kept() -> Any:
        original = click.formatting.wrap_text
        click.formatting.wrap_text = wrap_paragraphs
        try:
            yield
        finally:
            click.formatting.wrap_text = original

    class WordWrapFormatter(click.HelpFormatter):
        def write_text(self, text: str) -> None:
            with words_kept():
                super().write_text(text)

        def write_dl(self, rows: Any, col_max: int = 30, col_spacing: int = 2) -> None:
            with words_kept():
                super().write_dl(rows, col_max, col_spacing)

    return WordWrapFormatter


def fitted_words(text: str, width: int) -> str:
    """``text`` whose words fit a line of ``width``: a path below the working directory shown relative to it, any
    word still wider shortened from the middle (:func:`middle`), so a terminal or rich wraps the text between words
    and never folds a path in two."""
    words = []
    for word in text.split(" "):
        if word.startswith("/") and len(word) > width:
            word = shown_path(word)
        words.append(middle(word, max(12, width)))
    return " ".join(words)
