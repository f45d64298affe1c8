"""Notebook-defined code over torch RPC: functions and classes travel by value.

torch RPC pickles callables by reference, so a function defined in a notebook cell (it lives in
the kernel's ``__main__``) cannot be found by a worker. ``install()`` swaps the pickler that
torch's RPC layer uses for one built on ``cloudpickle``: functions and classes that cannot be
imported by name travel by value, while torch's own reducers for tensors, ``RRef`` and
``ScriptModule`` stay in charge of those objects. The receiving side needs nothing but
``pickle`` and ``cloudpickle``.

A by-value function also carries the source lines of the notebook cell it came from, so a
traceback raised on a worker shows the cell's code, not just its line numbers.
"""

from __future__ import annotations

import io
import linecache
import os
import pickle
import sys
import types
from collections import ChainMap
from collections.abc import Callable
from typing import Any

import cloudpickle

__all__ = ["dumps", "install", "installed", "register_patched"]

_installed = False


_SUBMODULE_CACHE: dict = {}
_find_submodules = cloudpickle.cloudpickle._find_imported_submodules


def _cached_submodules(code: types.CodeType, deps: Any) -> list:
    """cloudpickle's submodule scan, remembered per function until a module is imported.

    cloudpickle walks all of ``sys.modules`` (thousands of entries once torch is loaded) for
    every by-value function that names a module; in an RL loop that is milliseconds per RPC.
    """
    deps = list(deps)
    names = tuple(d.__name__ for d in deps if isinstance(d, types.ModuleType))
    if not names:
        return []
    key = (code, names)
    loaded = len(sys.modules)
    hit = _SUBMODULE_CACHE.get(key)
    if hit is not None and hit[0] == loaded:
        return hit[1]
    found = _find_submodules(code, deps)
    if len(_SUBMODULE_CACHE) > 4096:
        _SUBMODULE_CACHE.clear()
    _SUBMODULE_CACHE[key] = (loaded, found)
    return found


cloudpickle.cloudpickle._find_imported_submodules = _cached_submodules


def _with_source(filename: str, lines: list[str], make: Callable, args: tuple) -> Any:
    """Unpickling hook: register a cell's source lines, then build the function."""
    if filename not in linecache.cache:
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    return make(*args)


def _cell_source(filename: str) -> list[str] | None:
    """Source lines of a notebook cell known to this process's linecache, if any."""
    if not filename or os.path.exists(filename):
        return None
    entry = linecache.cache.get(filename)
    if entry is None or not isinstance(entry, tuple) or len(entry) < 3 or not entry[2]:
        return None
    return list(entry[2])


def _reduce_method(m: types.MethodType) -> Any:
    """Bound methods as plain pickle does it, ``getattr(owner, name)``.

    cloudpickle's own method reducer splits a method into function + owner, which ships
    classmethods of importable classes (torch's tensor receiver among them) by value.
    """
    return m.__reduce__()


_BY_NAME: dict[int, tuple[str, str]] = {}


def _load_attr(module: str, name: str) -> Any:
    """Unpickling hook: the receiver's own ``module.name`` (its own patched version)."""
    import importlib

    return getattr(importlib.import_module(module), name)


def register_patched(*module_names: str) -> None:
    """Ship nbdist's wrappers that replaced torch functions by name, never by value.

    A notebook cell that did ``from torch.distributed.rpc import rpc_sync`` refers to the
    wrapper nbdist put there; pickled by value it would drag nbdist's internals along.
    """
    for modname in module_names:
        mod = sys.modules.get(modname)
        for attr, value in vars(mod).items() if mod is not None else ():
            if isinstance(value, types.FunctionType) and \
                    getattr(value, "__module__", "").startswith("nbdist"):
                _BY_NAME[id(value)] = (modname, attr)


class ShippingPickler(cloudpickle.Pickler):
    """cloudpickle's by-value reducers plus the cell source of each shipped function."""

    def __init__(self, file: Any, protocol: int | None = None,
                 dispatch_table: Any = None) -> None:
        # The C pickler reads ``dispatch_table`` once, in __init__, and cloudpickle's class
        # attribute shadows the C-level setter: so it must be in place before __init__.
        if dispatch_table is not None:
            self.dispatch_table = dispatch_table
        super().__init__(file, protocol=protocol)

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.FunctionType and id(obj) in _BY_NAME:
            return (_load_attr, _BY_NAME[id(obj)])
        rv = super().reducer_override(obj)
        if rv is not NotImplemented and isinstance(obj, types.FunctionType):
            filename = obj.__code__.co_filename
            lines = _cell_source(filename)
            if lines is not None:
                return (_with_source, (filename, lines, rv[0], rv[1]), *rv[2:])
        return rv


def dumps(obj: Any) -> bytes:
    """Pickle with the shipping rules (used by ``%%dist`` and the tests)."""
    buf = io.BytesIO()
    ShippingPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def _rpc_pickler(owner: Any, f: io.BytesIO, obj: Any) -> ShippingPickler:
    """A ShippingPickler with torch's RPC reducers (tensors, RRefs, ScriptModules) in front."""
    import torch
    import torch.distributed as dist

    table = dict(owner._dispatch_table)
    table[dist.rpc.PyRRef] = owner._py_rref_reducer
    table[dist.rpc.RRef] = owner._rref_reducer
    table[types.MethodType] = _reduce_method
    if isinstance(obj, torch.jit.ScriptModule):
        table[obj.__class__] = owner._script_module_reducer
    table.update(owner._class_reducer_dict)
    return ShippingPickler(f, protocol=pickle.HIGHEST_PROTOCOL,
                           dispatch_table=ChainMap(table, cloudpickle.Pickler.dispatch_table))


def _serialize(self: Any, obj: Any) -> tuple[bytes, list]:
    """Drop-in for ``_InternalRPCPickler.serialize`` (same tensor-table protocol)."""
    from torch.distributed.rpc import internal

    f = io.BytesIO()
    tables = internal._thread_local_tensor_tables
    old = getattr(tables, "send_tables", None)
    tables.send_tables = []
    try:
        try:
            _rpc_pickler(self, f, obj).dump(obj)
        except Exception as exc:
            raise _explain_unpicklable(self, obj, exc) from exc
        tensors = tables.send_tables
    finally:
        if old is not None:
            tables.send_tables = old
        else:
            del tables.send_tables
    return f.getvalue(), tensors


def _explain_unpicklable(owner: Any, obj: Any, exc: Exception) -> Exception:
    """Name the argument (or function, or return value) that could not be pickled."""
    from torch.distributed.rpc.internal import PythonUDF

    if not isinstance(obj, PythonUDF):
        return TypeError(f"the RPC result could not be pickled to send back: {exc}")
    fname = getattr(obj.func, "__qualname__", repr(obj.func))
    parts = [("the function", obj.func)]
    parts += [(f"argument {i}", a) for i, a in enumerate(obj.args or ())]
    parts += [(f"keyword argument {k!r}", v) for k, v in (obj.kwargs or {}).items()]
    for label, value in parts:
        try:
            _rpc_pickler(owner, io.BytesIO(), value).dump(value)
        except Exception as inner:
            return TypeError(f"{label} of the RPC to {fname} ({type(value).__name__}) cannot be "
                             f"pickled: {inner}. Send something picklable instead (for a lock, "
                             "file or socket, create it on the worker)")
    return TypeError(f"the RPC to {fname} could not be pickled: {exc}")


def install() -> None:
    """Make torch RPC ship notebook-defined code by value in this process (idempotent)."""
    global _installed
    if _installed:
        return
    from torch.distributed.rpc import internal

    pickler = internal._internal_rpc_pickler
    pickler.serialize = types.MethodType(_serialize, pickler)
    _installed = True


def installed() -> bool:
    return _installed
