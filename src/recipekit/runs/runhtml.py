"""One self-contained HTML page from tables, lists and plots: no script, no stylesheet or font to fetch, every
image a base64 ``data:`` PNG, so the file opens offline and can be attached to a ticket as it is.

Every piece of text is escaped here (run labels, paths and messages come from pods and users). Standard library only.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence

from recipekit.runs.runplots import Plot

_STYLE = """
body { font-family: sans-serif; margin: 1.5em auto; max-width: 70em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
td:not(.num) { overflow-wrap: anywhere; }
th { background: #f2f2f2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.bad { color: #b00020; font-weight: bold; } .good { color: #1b7f2a; font-weight: bold; }
figure { margin: 1em 0; } figcaption { font-weight: bold; margin-bottom: 0.3em; }
img { max-width: 100%; border: 1px solid #eee; }
code { background: #f6f6f6; padding: 0 0.2em; }
"""


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def heading(text: str, level: int = 2) -> str:
    return f"<h{level}>{esc(text)}</h{level}>"


def paragraph(text: str, css: str = "") -> str:
    return f'<p class="{esc(css)}">{esc(text)}</p>' if css else f"<p>{esc(text)}</p>"


def items(lines: Sequence[str]) -> str:
    return "<ul>" + "".join(f"<li>{esc(line)}</li>" for line in lines) + "</ul>"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], numeric: Sequence[int] = ()) -> str:
    """A table; the columns in ``numeric`` are right-aligned."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="num">{esc(cell)}</td>' if i in numeric else f"<td>{esc(cell)}</td>"
            for i, cell in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def figure(plot: Plot) -> str:
    data = base64.b64encode(plot.png).decode("ascii")
    return (
        f'<figure id="{esc(plot.name)}"><figcaption>{esc(plot.title)}</figcaption>'
        f'<img alt="{esc(plot.title)}" src="data:image/png;base64,{data}"></figure>'
    )


def page(title: str, parts: Sequence[str]) -> str:
    """The whole document; ``parts`` are fragments made by this module's functions (already escaped)."""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_STYLE}</style></head>\n<body>\n"
        f"{heading(title, 1)}\n" + "\n".join(parts) + "\n</body></html>\n"
    )
