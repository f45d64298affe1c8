"""A logged record's shape, and how its values travel from a worker to the notebook.

A record is a dict: ``rank``, ``name`` (the rank's RPC name), ``step``, ``time`` (wall clock,
``time.time()`` when logged) and the logged values. Values other than ``float``, ``int``,
``str``, ``bool`` and ``None`` travel as an ``Opaque``: the value pickled on the worker plus
its ``repr``; the notebook rebuilds it when the batch is delivered and keeps the ``repr``
string when it cannot (a lock, a class only the worker has). A record with an ``INTERNAL`` key
is not the user's: it goes to the handler of its kind (``history.register_handler``).
"""

from __future__ import annotations

import pickle
from typing import Any

__all__ = ["INTERNAL", "META", "PLAIN", "REPR_CHARS", "Opaque", "plain", "record", "unwrap"]

META = ("rank", "name", "step", "time")
INTERNAL = "__nbdist__"
REPR_CHARS = 200  # an Opaque's repr is cut to this length
PLAIN = frozenset((float, int, str, bool, type(None)))


class Opaque:
    """A logged value that is not plain data, as it crosses from a worker: pickle and repr."""

    __slots__ = ("data", "text")

    def __init__(self, data: bytes | None, text: str) -> None:
        self.data, self.text = data, text

    @classmethod
    def wrap(cls, value: Any) -> Opaque:
        """``value`` pickled (``data`` None if it cannot be) with its repr."""
        try:
            text = repr(value)
        except Exception as exc:  # noqa: BLE001 - a repr that raises is still a value
            text = f"<{type(value).__name__} (repr failed: {exc})>"
        if len(text) > REPR_CHARS:
            text = text[: REPR_CHARS - 3] + "..."
        try:
            data: bytes | None = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - locks, sockets, generators...
            data = None
        return cls(data, text)

    def unwrap(self) -> Any:
        """The value again, or its repr string where it cannot be rebuilt here."""
        if self.data is not None:
            try:
                return pickle.loads(self.data)
            except Exception:  # noqa: BLE001 - a class this process lacks, and the like
                pass
        return self.text

    def __getstate__(self) -> tuple:
        return self.data, self.text

    def __setstate__(self, state: tuple) -> None:
        self.data, self.text = state

    def __repr__(self) -> str:
        return f"Opaque({self.text})"


def plain(v: Any) -> Any:
    """A one-element tensor or numpy value as a Python number; anything else unchanged."""
    item = getattr(v, "item", None)
    if item is not None:
        try:
            size = v.numel() if hasattr(v, "numel") else getattr(v, "size", 1)
            if size == 1:
                return item()
        except Exception:  # noqa: BLE001 - not a number-like after all
            return v
    return v


def unwrap(values: dict) -> dict:
    """``values`` with every ``Opaque`` rebuilt (in place)."""
    for key, v in values.items():
        if type(v) is Opaque:
            values[key] = v.unwrap()
    return values


def record(rank: int, name: str, step: int, t: float, values: dict) -> dict:
    """One record dict: its meta fields, then its values."""
    rec = {"rank": rank, "name": name, "step": step, "time": t}
    rec.update(values)
    return rec
