"""Notebook code travels by value: the pickler every RPC, spawn and cell uses, and what keeps
each rank's copy of a cell's definitions its own (docs/layout.md, lists each module)."""

__all__: list[str] = []
