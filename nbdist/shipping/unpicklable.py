"""Which global made notebook code unpicklable, and the chain of code that reached it.

``find(func, can_pickle, by_value)`` walks what a by-value function takes along: the globals
its code reads, its closure, its defaults; into the functions and classes among them (a class
through its methods and attributes), and into the attributes of plain objects. It returns the
first value that ``can_pickle`` refuses as a chain such as
``trainer_side -> TrainerNet.__init__ -> get_parameter_server -> server_socket`` with the error.
Only the failure path runs this: it may pickle each value it meets once more.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from ..patches import cloudpickle_private

__all__ = ["Culprit", "find"]

_MAX_DEPTH = 12


class Culprit:
    """A value that cannot be pickled: the chain of names that reached it, and why."""

    def __init__(self, chain: list[str], value: Any, error: Exception) -> None:
        self.chain = chain
        self.value = value
        self.error = error

    @property
    def path(self) -> str:
        return " -> ".join(self.chain)

    @property
    def name(self) -> str:
        return self.chain[-1]


def _function_parts(func: types.FunctionType) -> list[tuple[str, Any]]:
    g = func.__globals__
    names = cloudpickle_private.extract_code_globals(func.__code__)
    parts = [(n, g[n]) for n in names if n in g]
    for var, cell in zip(func.__code__.co_freevars, func.__closure__ or (), strict=False):
        try:
            parts.append((var, cell.cell_contents))
        except ValueError:  # an empty cell
            pass
    for i, value in enumerate(func.__defaults__ or ()):
        parts.append((f"{func.__qualname__}.<default {i}>", value))
    for k, value in (func.__kwdefaults__ or {}).items():
        parts.append((f"{func.__qualname__}.<default {k}>", value))
    return parts


def _class_parts(cls: type) -> list[tuple[str, Any]]:
    parts = []
    for attr, value in vars(cls).items():
        if attr.startswith("__") and attr.endswith("__") and attr != "__init__":
            continue
        if isinstance(value, staticmethod | classmethod):
            value = value.__func__
        elif isinstance(value, property):
            value = value.fget
        parts.append((f"{cls.__qualname__}.{attr}", value))
    return parts


def find(func: Any, can_pickle: Callable[[Any], Exception | None],
         by_value: Callable[[Any], bool]) -> Culprit | None:
    """The first value reached from ``func`` that ``can_pickle`` refuses (it returns the
    error, or ``None`` for a value that pickles); ``by_value`` says which functions and
    classes travel by value (their insides are what to search)."""
    seen: set[int] = set()

    def walk(obj: Any, chain: list[str], depth: int) -> Culprit | None:
        if id(obj) in seen or depth > _MAX_DEPTH:
            return None
        seen.add(id(obj))
        if isinstance(obj, types.FunctionType):
            if not by_value(obj):
                return None
            parts, base = _function_parts(obj), chain
        elif isinstance(obj, type):
            if not by_value(obj):
                return None
            parts, base = _class_parts(obj), chain[:-1]  # its parts say "Class.attr"
        else:
            error = can_pickle(obj)
            if error is None:
                return None
            attrs = getattr(obj, "__dict__", None)
            if isinstance(attrs, dict):  # look one level in: which attribute is it?
                for attr, value in attrs.items():
                    found = walk(value, chain[:-1] + [f"{chain[-1]}.{attr}"], depth + 1)
                    if found is not None:
                        return found
            return Culprit(chain, obj, error)
        for label, value in parts:
            if isinstance(value, types.FunctionType | type) and by_value(value):
                label = value.__qualname__ if label == value.__name__ else label
            if isinstance(value, types.ModuleType):
                continue
            found = walk(value, base + [label], depth + 1)
            if found is not None:
                return found
        return None

    label = getattr(func, "__qualname__", type(func).__name__)
    return walk(func, [label], 0)
