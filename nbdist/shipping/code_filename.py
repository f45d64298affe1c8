"""Code objects that keep their file name when shipped by value.

A remote traceback shows the cell's lines only if the shipped code object keeps the cell's file
name (the callee registers the source in ``linecache`` under it). ``reduce_code`` ships code
with cloudpickle's reducer and puts the real name back on arrival; with a cloudpickle that
keeps the name it returns cloudpickle's reduction unchanged. Why: ``bench/results/notes.md``.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import cloudpickle

__all__ = ["reduce_code"]

_cloudpickle_reduce: Callable[[types.CodeType], Any] = cloudpickle.Pickler.dispatch_table[
    types.CodeType]


def _renamed(make: Callable, args: tuple, filename: str) -> types.CodeType:
    """Unpickling hook: cloudpickle's code object, with its own file name back."""
    return make(*args).replace(co_filename=filename)


def reduce_code(code: types.CodeType) -> Any:
    """A pickler's reducer for code objects: cloudpickle's, keeping ``co_filename``."""
    rv = _cloudpickle_reduce(code)
    make, args = rv[0], rv[1]
    filename = code.co_filename
    if filename in args:
        return rv  # this cloudpickle kept the name
    return (_renamed, (make, args, filename))
