"""Reference pages made from the code at build time, so they cannot drift from it.

``nbdist-magics``: every magic and flag, from the argument parser that implements it.
``nbdist-errors``: every error nbdist raises, from ``nbdist.errors`` (what it means, what to do).
``nbdist-changes``: what nbdist changes of torch's behaviour, from the two tables the
conformance suites judge by (``tests/conformance/intended.py``, ``tests/torch_rpc/intended.py``).
"""

from __future__ import annotations

import argparse
import inspect
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

__all__ = ["setup"]


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table (the directives' text is parsed as MyST)."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out + [""]


class _Generated(SphinxDirective):
    has_content = False

    def lines(self) -> list[str]:
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(self.state, StringList(self.lines(), source="nbdist"), node)
        return node.children


def magic_parsers() -> list[tuple[str, str, Any]]:
    """(``%name`` or ``%%name``, docstring, parser) for every nbdist magic."""
    from nbdist.magics import DistMagics

    found = []
    for kind, prefix in (("line", "%"), ("cell", "%%")):
        for name, attr in DistMagics.magics[kind].items():
            fn = getattr(DistMagics, attr)
            found.append((prefix + name, inspect.getdoc(fn) or "", getattr(fn, "parser", None)))
    return found


def _flag_rows(parser: argparse.ArgumentParser) -> list[list[str]]:
    rows = []
    for action in parser._actions:  # argparse keeps no public list of its actions
        if isinstance(action, argparse._HelpAction):
            continue
        names = ", ".join(action.option_strings) or action.dest
        choices = ", ".join(map(str, action.choices)) if action.choices else ""
        default = "" if action.default in (None, argparse.SUPPRESS) else repr(action.default)
        helptext = (action.help or "").replace("%%", "%")
        rows.append([f"`{names}`", helptext, choices, default])
    return rows


class MagicsDirective(_Generated):
    def lines(self) -> list[str]:
        out: list[str] = []
        for name, doc, parser in magic_parsers():
            out += [f"## `{name}`", ""]
            if parser is not None:
                usage = parser.format_usage().replace("usage: ", "").strip()
                out += ["```text", " ".join(usage.split()), "```", ""]
            out += doc.replace("%%", "%").splitlines() + [""]
            rows = _flag_rows(parser) if parser is not None else []
            if rows:
                out += _table(["flag", "what it does", "choices", "default"], rows)
        return out


class ErrorsDirective(_Generated):
    def lines(self) -> list[str]:
        from nbdist import errors

        out: list[str] = []
        for name in errors.RAISED:
            cls = getattr(errors, name)
            bases = ", ".join(f"`{b.__name__}`" for b in cls.__bases__)
            out += [f"## `nbdist.{name}`", "", f"A subclass of {bases}.", ""]
            out += (inspect.getdoc(cls) or "").splitlines() + [""]
        return out


class ChangesDirective(_Generated):
    def lines(self) -> list[str]:
        from tests.conformance import intended as groups
        from tests.torch_rpc import intended as rpc

        out = ["## Process groups (`tests/conformance/intended.py`)", ""]
        out += _table(["what", "in a script", "in a world", "why"], _group_rows(groups))
        out += ["## torch's RPC tests (`tests/torch_rpc/intended.py`)", ""]
        rows = [[f"`{e.test}`", f"{e.form}: {e.world} here, {e.reference} in the reference",
                 e.why] for e in rpc.INTENDED]
        rows += [[f"`{t}`", "world form: ends either way, on both sides", why]
                 for t, why in rpc.FLAKY.items()]
        out += _table(["test", "what differs", "why"], rows)
        return out


def _group_rows(module: Any) -> list[list[str]]:
    return [[e.what, e.in_script, e.in_world, e.why] for e in module.INTENDED]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("nbdist-magics", MagicsDirective)
    app.add_directive("nbdist-errors", ErrorsDirective)
    app.add_directive("nbdist-changes", ChangesDirective)
    return {"version": "1", "parallel_read_safe": True}
