"""Twins: a function or class that two ranks each defined from the same cell.

When one rank sends a class or function to another, the receiver's own definition under the
same qualified name with the same code is its *twin* and stands for it, as one imported module
does in a script. "The same code" is a digest of the source text (from ``linecache``), not of
the code object; without source, bytecode, constants and names stand in. Nothing here knows
which objects are copies: ``shipping`` asks and decides. Why source:
docs/how-it-works.md, Module notes.
"""

from __future__ import annotations
import __future__

import hashlib
import inspect
import linecache
import textwrap
import types
import weakref
from typing import Any

__all__ = ["class_key", "code_key", "lookup", "twin_class", "twin_function"]

# a cell compiled under another rank's ``from __future__`` flags still does the same
_NOT_FUTURE = ~sum(getattr(__future__, name).compiler_flag for name in __future__.all_feature_names)
_CODE_KEYS_PER_PROCESS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CLASS_KEYS_PER_PROCESS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _feed(h: Any, code: types.CodeType) -> None:
    h.update(code.co_code)
    h.update(repr((getattr(code, "co_qualname", code.co_name), code.co_argcount,
                   code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags & _NOT_FUTURE,
                   code.co_names, code.co_varnames, code.co_freevars,
                   code.co_cellvars)).encode())
    for const in code.co_consts:
        _feed_const(h, const)


def _feed_const(h: Any, const: Any) -> None:
    if isinstance(const, types.CodeType):
        _feed(h, const)
    elif isinstance(const, tuple):
        h.update(b"(")
        for c in const:
            _feed_const(h, c)
        h.update(b")")
    elif isinstance(const, frozenset):  # its order follows the process's string hashes
        h.update(repr(sorted(map(repr, const))).encode())
    else:
        h.update(repr(const).encode())
    h.update(b",")


def _source(code: types.CodeType) -> str | None:
    """The source block that defined ``code``, dedented, if this process has its text."""
    lines = linecache.getlines(code.co_filename)
    first = code.co_firstlineno
    if not lines or not 0 < first <= len(lines):
        return None
    try:
        block = inspect.getblock(lines[first - 1:])
    except (SyntaxError, IndentationError, ValueError):  # tokenize's errors
        return None
    return textwrap.dedent("".join(block))


def code_key(code: types.CodeType) -> str:
    """A digest of the definition ``code`` came from, equal in every process that ran the
    same cell (its source; without source, its bytecode, constants and names)."""
    key = _CODE_KEYS_PER_PROCESS.get(code)
    if key is None:
        h = hashlib.blake2b(digest_size=16)
        source = _source(code)
        if source is not None:
            h.update(f"source {code.co_name}\n{source}".encode())
        else:
            _feed(h, code)
        key = _CODE_KEYS_PER_PROCESS[code] = h.hexdigest()
    return key


def _codes(cls: type) -> list[tuple[str, types.CodeType]]:
    """The code of every function in a class's own namespace, by attribute name."""
    found = []
    for name, value in vars(cls).items():
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property):
            found += [(f"{name}.{part}", f.__code__) for part, f in
                      (("get", value.fget), ("set", value.fset), ("del", value.fdel))
                      if isinstance(f, types.FunctionType)]
        elif isinstance(value, types.FunctionType):
            found.append((name, value.__code__))
    return sorted(found, key=lambda item: item[0])


_RUNTIME_ATTRS = {"__dict__", "__weakref__", "__doc__", "__module__"}


def class_key(cls: type) -> str:
    """A digest of a class's qualified name and its functions' code (remembered per class
    until one of its functions is replaced)."""
    codes = _codes(cls)
    token = tuple(id(code) for _, code in codes)
    hit = _CLASS_KEYS_PER_PROCESS.get(cls)
    if hit is not None and hit[0] == token:
        return hit[1]
    h = hashlib.blake2b(digest_size=16)
    h.update(cls.__qualname__.encode())
    h.update(repr(sorted(set(vars(cls)) - _RUNTIME_ATTRS)).encode())
    for name, code in codes:
        h.update(f";{name}={code_key(code)}".encode())
    key = h.hexdigest()
    _CLASS_KEYS_PER_PROCESS[cls] = (token, key)
    return key


def lookup(ns: dict, qualname: str) -> Any:
    """What ``qualname`` names in namespace ``ns`` (through classes' own namespaces; a
    static or class method as its function), or None."""
    parts = qualname.split(".")
    if "<locals>" in parts:
        return None
    obj = ns.get(parts[0])
    for part in parts[1:]:
        if not isinstance(obj, type):
            return None
        obj = vars(obj).get(part)
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    return obj


def twin_function(ns: dict, qualname: str, code: types.CodeType) -> types.FunctionType | None:
    """The function of ``ns`` under ``qualname`` whose code does what ``code`` does, if any
    (the caller rules out copies that arrived from elsewhere)."""
    own = lookup(ns, qualname)
    if (type(own) is types.FunctionType and own.__globals__ is ns
            and (own.__code__ is code or code_key(own.__code__) == code_key(code))):
        return own
    return None


def twin_class(ns: dict, qualname: str, key: str, bases: tuple) -> type | None:
    """The class of ``ns`` under ``qualname`` with the same bases and ``class_key``, if any
    (the caller rules out copies that arrived from elsewhere)."""
    own = lookup(ns, qualname)
    if (isinstance(own, type) and own.__module__ == "__main__" and own.__bases__ == bases
            and class_key(own) == key):
        return own
    return None
