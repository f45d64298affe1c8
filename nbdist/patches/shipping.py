"""Notebook-defined code over torch RPC: functions and classes travel by value.

torch RPC pickles callables by reference, so a function defined in a notebook cell (it lives in
the kernel's ``__main__``) cannot be found by a worker. ``install()`` swaps the pickler that
torch's RPC layer uses for one built on ``cloudpickle``: functions and classes that cannot be
imported by name travel by value, while torch's own reducers for tensors, ``RRef`` and
``ScriptModule`` stay in charge of those objects. The receiving side needs nothing but
``pickle`` and ``cloudpickle``.

A by-value function also carries the source lines of the notebook cell it came from, so a
traceback raised on a worker shows the cell's code, not just its line numbers.

Code once per destination: in an RPC request, a by-value function's code object and its cell's
source lines travel only the first time they go to a destination; later requests name them by
a digest (unique per code object of this process). Everything else of the function (the
globals it reads, closure values, defaults, attributes) is pickled on every call as before, so
what runs is what cloudpickle would have shipped: a cell that redefines a function makes a new
code object, hence a new digest, hence a full send. A callee that gets a digest before the
request that defines it (torch may run two requests of one pipe in parallel threads) waits for
it, up to ``CODE_WAIT`` seconds. ``install()`` (every new world) forgets what peers hold.
"""

from __future__ import annotations

import builtins
import io
import itertools
import linecache
import os
import pickle
import sys
import threading
import time
import types
from collections import ChainMap
from collections.abc import Callable
from typing import Any

import cloudpickle

from . import torch_private
from .code_filename import reduce_code

__all__ = ["CODE_WAIT", "dumps", "forget_peers", "install", "installed", "register_patched"]

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


# ---------------------------------------------------------------- code once per destination
CODE_WAIT = 30.0  # seconds a callee waits for the request that defines a digest it was sent
_KEEP_CODES = 4096  # code objects remembered by a caller (then forgotten: sent again in full)
_KEEP_KNOWN = 65536  # code objects remembered by a callee

_fns: dict[int, tuple] = {}  # id(func) -> (func, static parts, digest, global names)
_sent: set[tuple[str, str]] = set()  # (destination name, digest) it holds
_known: dict[str, tuple] = {}  # digest -> static parts of a function, callee side
_known_cv = threading.Condition()
_nonce: list = [os.urandom(6).hex(), itertools.count(1)]  # digest prefix, counter (atomic)


class _Tls(threading.local):
    dest: str | None = None  # the destination of the request being pickled on this thread
    pending: Any = None  # (dest, [digests]) to mark as sent once the request went out


_tls = _Tls()


def _after_fork() -> None:
    """A forked child is a new peer: its own digests, nothing sent, nothing known."""
    _nonce[:] = [os.urandom(6).hex(), itertools.count(1)]
    _fns.clear()
    _sent.clear()
    _known.clear()


os.register_at_fork(after_in_child=_after_fork)


def forget_peers() -> None:
    """A new world: its processes hold none of our code yet."""
    _sent.clear()


def _static_of(func: types.FunctionType) -> tuple[tuple, str, tuple]:
    """What of ``func`` travels once (code, names, doc, annotations), its digest, and the
    names of the globals its code reads; a new digest whenever any of those changed."""
    entry = _fns.get(id(func))
    if entry is not None and entry[0] is func:
        old = entry[1]
        if (old[0] is func.__code__ and old[1] is func.__name__ and old[2] is func.__qualname__
                and old[3] is func.__module__ and old[4] is func.__doc__
                and old[5] is func.__annotations__):
            return old, entry[2], entry[3]
    static = (func.__code__, func.__name__, func.__qualname__, func.__module__, func.__doc__,
              func.__annotations__)
    if len(_fns) >= _KEEP_CODES:
        _fns.clear()
        _sent.clear()  # a digest we forget may be given again: send its code again too
    digest = f"{_nonce[0]}.{next(_nonce[1])}"  # next() is atomic: threads never share one
    names = tuple(cloudpickle.cloudpickle._extract_code_globals(func.__code__))
    _fns[id(func)] = (func, static, digest, names)
    return static, digest, names


_EMPTY = cloudpickle.cloudpickle._empty_cell_value


def _dynamic_state(func: types.FunctionType, names: tuple) -> tuple:
    """What of ``func`` travels on every call: the globals it reads, defaults, closure values,
    attributes (and the submodules it uses, imported on arrival as cloudpickle does)."""
    g = func.__globals__
    f_globals = {k: g[k] for k in names if k in g}
    closure = func.__closure__
    cells = None if closure is None else tuple(
        cloudpickle.cloudpickle._get_cell_contents(c) for c in closure)
    values = list(f_globals.values())
    if cells:
        values.extend(cells)
    subs = _cached_submodules(func.__code__, values) if values else None
    return (f_globals, func.__defaults__, func.__kwdefaults__, cells, func.__dict__ or None,
            subs or None)


def _set_dynamic(func: types.FunctionType, state: tuple) -> None:
    """Unpickling hook (the state setter of ``_make_new``/``_make_known``)."""
    f_globals, defaults, kwdefaults, cells, fdict, _subs = state
    func.__globals__.update(f_globals)
    if defaults is not None:
        func.__defaults__ = defaults
    if kwdefaults is not None:
        func.__kwdefaults__ = kwdefaults
    if cells is not None:
        for cell, value in zip(func.__closure__, cells, strict=True):
            if value is not _EMPTY:
                cell.cell_contents = value
    if fdict:
        func.__dict__.update(fdict)


def _build(static: tuple, base_globals: dict) -> types.FunctionType:
    code, name, qualname, module, doc, annotations = static
    base_globals["__builtins__"] = builtins
    closure = tuple(types.CellType() for _ in code.co_freevars) if code.co_freevars else None
    func = types.FunctionType(code, base_globals, name, None, closure)
    func.__qualname__ = qualname
    func.__module__ = module
    func.__doc__ = doc
    if annotations:
        func.__annotations__ = dict(annotations)
    return func


def _make_new(digest: str, static: tuple, filename: str, lines: list[str] | None,
              base_globals: dict) -> types.FunctionType:
    """Unpickling hook: a function whose code comes with it (the first time to this rank)."""
    if lines is not None and filename not in linecache.cache:
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    if digest not in _known:
        with _known_cv:
            if len(_known) >= _KEEP_KNOWN:
                _known.pop(next(iter(_known)))
            _known[digest] = static
            _known_cv.notify_all()
    return _build(static, base_globals)


def _make_known(digest: str, base_globals: dict) -> types.FunctionType:
    """Unpickling hook: a function whose code this rank was sent before, named by digest."""
    static = _known.get(digest)
    if static is None:
        give_up = time.monotonic() + CODE_WAIT
        with _known_cv:
            while (static := _known.get(digest)) is None:
                left = give_up - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"nbdist: the code of a notebook function ({digest}) "
                                       f"never reached this rank within {CODE_WAIT:.0f}s")
                _known_cv.wait(min(left, 0.5))
    return _build(static, base_globals)


class ShippingPickler(cloudpickle.Pickler):
    """cloudpickle's by-value reducers plus the cell source of each shipped function.

    With ``dest`` set (an RPC request), a by-value function's code goes to ``dest`` once and
    is named by digest afterwards; the digests sent for the first time are in ``new_codes``.
    """

    dispatch_table = ChainMap({types.CodeType: reduce_code}, cloudpickle.Pickler.dispatch_table)

    def __init__(self, file: Any, protocol: int | None = None,
                 dispatch_table: Any = None, dest: str | None = None) -> None:
        # The C pickler reads ``dispatch_table`` once, in __init__, and cloudpickle's class
        # attribute shadows the C-level setter: so it must be in place before __init__.
        if dispatch_table is not None:
            self.dispatch_table = dispatch_table
        super().__init__(file, protocol=protocol)
        self.dest = dest
        self.new_codes: list[str] = []

    def reducer_override(self, obj: Any) -> Any:
        t = type(obj)
        if t is types.FunctionType:
            by_name = _BY_NAME.get(id(obj))
            if by_name is not None:
                return (_load_attr, by_name)
            if _by_reference(obj):
                return NotImplemented
            return self._function_by_value(obj)
        if issubclass(t, type):
            hit = _by_ref.get(id(obj))
            if hit is not None and hit[0] is obj:
                return NotImplemented  # only "by reference" is remembered for classes
            rv = super().reducer_override(obj)
            if rv is NotImplemented:
                _remember(obj, True)
            return rv
        return NotImplemented

    def _function_by_value(self, obj: types.FunctionType) -> Any:
        dest = self.dest
        if dest is None:  # not a request: cloudpickle's own form, with the cell's source
            make, newargs, state, _, _, setstate = self._dynamic_function_reduce(obj)
            filename = obj.__code__.co_filename
            lines = _cell_source(filename)
            if lines is None:
                return (make, newargs, state, None, None, setstate)
            return (_with_source, (filename, lines, make, newargs), state, None, None, setstate)
        static, digest, names = _static_of(obj)
        g = obj.__globals__
        base = self.globals_ref.get(id(g))  # shared by this request's functions, as cloudpickle
        if base is None:
            base = self.globals_ref[id(g)] = {k: g[k] for k in _BASE_KEYS if k in g}
        state = _dynamic_state(obj, names)
        if (dest, digest) in _sent:
            return (_make_known, (digest, base), state, None, None, _set_dynamic)
        self.new_codes.append(digest)
        filename = static[0].co_filename
        return (_make_new, (digest, static, filename, _cell_source(filename), base), state,
                None, None, _set_dynamic)


_BASE_KEYS = ("__package__", "__name__", "__path__", "__file__")
_by_ref: dict[int, tuple[Any, bool]] = {}  # id -> (function or class, by reference?)


def _remember(obj: Any, verdict: bool) -> None:
    if len(_by_ref) >= _KEEP_CODES:
        _by_ref.clear()
    _by_ref[id(obj)] = (obj, verdict)


def _by_reference(func: types.FunctionType) -> bool:
    """cloudpickle's "importable by name?" verdict, remembered per function object (the
    entry holds the function, so its id cannot be reused while it is remembered)."""
    hit = _by_ref.get(id(func))
    if hit is not None and hit[0] is func:
        return hit[1]
    verdict = cloudpickle.cloudpickle._should_pickle_by_reference(func)
    _remember(func, verdict)
    return verdict


def dumps(obj: Any) -> bytes:
    """Pickle with the shipping rules (used by ``%%dist`` and the tests)."""
    buf = io.BytesIO()
    ShippingPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


_table_cache: list = [None, None, -1]  # [owner, table, len(owner._class_reducer_dict)]


def _dispatch_table(owner: Any) -> dict:
    """torch's RPC reducers (tensors, RRefs) over cloudpickle's, merged once into a plain dict
    (a ChainMap would cost a Python call per pickled object); rebuilt when torch registers a
    new class reducer."""
    n = len(owner._class_reducer_dict)
    if _table_cache[0] is owner and _table_cache[2] == n:
        return _table_cache[1]
    import torch.distributed as dist

    table = dict(cloudpickle.Pickler.dispatch_table)
    table.update(owner._dispatch_table)
    table[dist.rpc.PyRRef] = owner._py_rref_reducer
    table[dist.rpc.RRef] = owner._rref_reducer
    table[types.MethodType] = _reduce_method
    table[types.CodeType] = reduce_code  # the cell's file name, for remote tracebacks
    table.update(owner._class_reducer_dict)
    _table_cache[:] = [owner, table, n]
    return table


def _rpc_pickler(owner: Any, f: io.BytesIO, obj: Any, dest: str | None = None) -> ShippingPickler:
    """A ShippingPickler with torch's RPC reducers (tensors, RRefs, ScriptModules) in front."""
    table = _dispatch_table(owner)
    if _ScriptModule is not None and isinstance(obj, _ScriptModule):
        table = {**table, obj.__class__: owner._script_module_reducer}
    return ShippingPickler(f, protocol=pickle.HIGHEST_PROTOCOL, dispatch_table=table, dest=dest)


_ScriptModule: Any = None
_PythonUDF: Any = None


def _serialize(self: Any, obj: Any) -> tuple[bytes, list]:
    """Drop-in for ``_InternalRPCPickler.serialize`` (same tensor-table protocol)."""
    tables = _thread_tables
    old = getattr(tables, "send_tables", None)
    tables.send_tables = []
    tls = _tls
    tls.pending = None
    dest = tls.dest if type(obj) is _PythonUDF else None  # a request: code once per peer
    tls.dest = None
    f = io.BytesIO()
    try:
        pickler = _rpc_pickler(self, f, obj, dest)
        try:
            pickler.dump(obj)
        except Exception as exc:
            raise _explain_unpicklable(self, obj, exc) from exc
        tensors = tables.send_tables
    finally:
        if old is not None:
            tables.send_tables = old
        else:
            del tables.send_tables
    if pickler.new_codes:
        tls.pending = (dest, pickler.new_codes)
    return f.getvalue(), tensors


_thread_tables: Any = None


def _wrap_to_worker_info(orig: Callable) -> Callable:
    """torch resolves the destination right before it pickles a request: remember it."""
    def _to_worker_info(to: Any) -> Any:
        info = orig(to)
        _tls.dest = info.name
        return info

    return _to_worker_info


def _wrap_invoke(orig: Callable) -> Callable:
    """Once a request went out, its destination holds the code it carried."""
    def invoke(dst: Any, pickled: bytes, tensors: Any, timeout: float, is_async: bool) -> Any:
        res = orig(dst, pickled, tensors, timeout, is_async)
        pending = _tls.pending
        if pending is not None:
            _tls.pending = None
            dest, digests = pending
            for d in digests:
                _sent.add((dest, d))
        return res

    return invoke


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
    """Make torch RPC ship notebook-defined code by value in this process (idempotent); every
    call (each new world) also forgets which code the peers hold."""
    global _installed, _ScriptModule, _PythonUDF, _thread_tables
    forget_peers()
    if _installed or not torch_private.usable("shipping"):
        return
    import torch
    from torch.distributed.rpc import api, internal

    _ScriptModule = torch.jit.ScriptModule
    _PythonUDF = internal.PythonUDF
    _thread_tables = internal._thread_local_tensor_tables
    pickler = internal._internal_rpc_pickler
    pickler.serialize = types.MethodType(_serialize, pickler)
    api._to_worker_info = _wrap_to_worker_info(api._to_worker_info)
    api._invoke_rpc_python_udf = _wrap_invoke(api._invoke_rpc_python_udf)
    api._invoke_remote_python_udf = _wrap_invoke(api._invoke_remote_python_udf)
    _installed = True


def installed() -> bool:
    """Whether ``install`` ran in this process."""
    return _installed
