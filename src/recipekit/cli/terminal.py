"""The one way recipekit prints through rich: foreign text is never parsed as markup, and width is the terminal's.

Text that comes from a pod's log, a library's message, a user's path or a team's recipe may hold square brackets
(``[/__w/pytorch/third_party/gloo/pair.cc:553]``) that rich would read as a closing tag and raise ``MarkupError``
on. Everything that is not recipekit's own literal goes through :func:`plain`; recipekit's own styling is done with
``style=`` arguments, never with markup in an f-string. rich is imported lazily: ``build`` does not pay for it.
"""

from __future__ import annotations

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
) -> Any:
    """A table whose cells wrap between words: each column in ``whole`` (default: all) is at least as wide as its
    longest word (an option name, a run directory, an image reference, a number), so none is cut; in the others a
    word wider than the column is folded, never hidden behind an ellipsis. Every cell is plain text (:func:`plain`).
    """
    from rich.table import Table

    table = Table(title=plain(title) if title else None, caption=caption, title_justify="left")
    for i, header in enumerate(headers):
        words = [word for text in [header, *(row[i] for row in rows)] for word in text.split()]
        kept = whole is None or i in whole  # no word of this column is cut
        widest = max(map(len, words), default=1) if kept else None
        table.add_column(plain(header), overflow="fold", min_width=widest, no_wrap=whole is not None and kept)
    for row in rows:
        table.add_row(*(plain(cell) for cell in row))
    return table
