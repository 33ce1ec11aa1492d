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
