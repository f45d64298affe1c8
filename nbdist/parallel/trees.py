"""Walking nested arguments: tuples, lists, dicts and namedtuples of tensors and other values.

Only these containers are opened; anything else (a module, a number, a string) is a leaf.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["leaves", "tree_map"]


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def leaves(tree: Any) -> Iterator[Any]:
    """Every leaf of ``tree``, depth first, in order."""
    if isinstance(tree, (tuple, list)):
        for item in tree:
            yield from leaves(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from leaves(item)
    else:
        yield tree


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``tree`` with every leaf replaced by ``fn(leaf)``; container types are kept."""
    if _is_namedtuple(tree):
        return type(tree)(*(tree_map(fn, item) for item in tree))
    if isinstance(tree, tuple):
        return tuple(tree_map(fn, item) for item in tree)
    if isinstance(tree, list):
        return [tree_map(fn, item) for item in tree]
    if isinstance(tree, dict):
        out = {k: tree_map(fn, v) for k, v in tree.items()}
        if type(tree) is dict:
            return out
        try:
            return type(tree)(out)
        except TypeError:  # e.g. defaultdict: its first argument is the factory
            return out
    return fn(tree)
