"""Tables of strings: plain text (left-aligned columns two spaces apart, no trailing blanks)
and the same rows as HTML, for the ``_repr_html_`` of nbdist's status and stats tables."""

from __future__ import annotations

import csv
import html
from collections.abc import Sequence

__all__ = ["html_table", "human_bytes", "text_table", "write_csv"]


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``header`` and ``rows`` (strings) as aligned lines."""
    table = [list(header), *(list(r) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in table)


def html_table(css_class: str, header: Sequence[str], rows: Sequence[Sequence[str]],
               row_attrs: Sequence[str] | None = None) -> str:
    """``header`` and ``rows`` (escaped here) as an HTML table of class ``css_class``;
    ``row_attrs`` are put inside each row's ``<tr>`` as they are (e.g. a style)."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in header)
    attrs = row_attrs if row_attrs is not None else [""] * len(rows)
    body = "".join(f"<tr{a}>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                   for r, a in zip(rows, attrs, strict=True))
    return f"<table class='{css_class}'><tr>{head}</tr>{body}</table>"


def human_bytes(n: float) -> str:
    """``512 B``, ``20 KB``, ``14.7 MB``, ``2.0 GB`` (powers of 1024)."""
    for unit in ("B", "KB", "MB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit != "MB" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def write_csv(path: str, columns: Sequence[str], rows: Sequence[dict]) -> str:
    """``rows`` (dicts) as a CSV file with a header of ``columns``; returns ``path``."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        w.writerows(rows)
    return path
