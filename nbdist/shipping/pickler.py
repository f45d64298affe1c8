"""Notebook-defined code over torch RPC: functions and classes travel by value.

``install()`` (every new world; it forgets what peers hold) swaps the pickler torch's RPC layer
uses for one built on cloudpickle: what cannot be imported by name travels by value, while
torch's own reducers stay in charge of tensors, ``RRef`` and ``ScriptModule``. A function's
code and its cell's source go to each destination once, then by digest (a callee waits up to
``CODE_WAIT`` seconds for a digest it has not seen); the rest of it is pickled on every call,
so what runs is what cloudpickle would have shipped. Arriving code runs against the receiving
rank's ``__main__`` (``mirror``, ``twins``, ``fresh``). The whole rule:
docs/how-it-works.md, Module notes.
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
import weakref
from collections import ChainMap
from collections.abc import Callable
from typing import Any

import cloudpickle

from .. import world_state
from ..patches import cloudpickle_private, rpc_calls, torch_private
from ..patches.installed import first_time, forget, has
from ..shipping import fresh_locks, own_main, per_rank, unpicklable
from ..shm import transport as shm
from .code_filename import reduce_code

__all__ = ["CODE_WAIT", "dumps", "forget_peers", "install", "installed", "register_patched",
           "uninstall"]



_find_submodules = cloudpickle_private.find_imported_submodules


def _cached_submodules(code: types.CodeType, deps: Any) -> list:
    """cloudpickle's submodule scan, remembered per function until a module is imported.

    cloudpickle walks all of ``sys.modules`` (thousands of entries once torch is loaded) for
    every by-value function that names a module; in an RL loop that is milliseconds per RPC.
    Only nbdist's own pickling asks it (``_dynamic_state``): cloudpickle's own function, which
    other users of cloudpickle in the process (Ray, Dask) reach, stays as it is.
    """
    shipped = _SHIPPED_PER_PROCESS
    deps = list(deps)
    names = tuple(d.__name__ for d in deps if isinstance(d, types.ModuleType))
    if not names:
        return []
    key = (code, names)
    loaded = len(sys.modules)
    hit = shipped.submodules.get(key)
    if hit is not None and hit[0] == loaded:
        return hit[1]
    found = _find_submodules(code, deps)
    if len(shipped.submodules) > 4096:
        shipped.submodules.clear()
    shipped.submodules[key] = (loaded, found)
    return found


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




def _load_attr(module: str, name: str) -> Any:
    """Unpickling hook: the receiver's own ``module.name`` (its own patched version)."""
    import importlib

    return getattr(importlib.import_module(module), name)


def register_patched(*module_names: str) -> None:
    """Ship nbdist's wrappers that replaced torch functions by name, never by value.

    A notebook cell that did ``from torch.distributed.rpc import rpc_sync`` refers to the
    wrapper nbdist put there; pickled by value it would drag nbdist's internals along.
    """
    shipped = _SHIPPED_PER_PROCESS
    for modname in module_names:
        mod = sys.modules.get(modname)
        for attr, value in vars(mod).items() if mod is not None else ():
            if isinstance(value, types.FunctionType) and \
                    getattr(value, "__module__", "").startswith("nbdist"):
                shipped.by_name[id(value)] = (modname, attr)


# ---------------------------------------------------------------- code once per destination
CODE_WAIT = 30.0  # seconds a callee waits for the request that defines a digest it was sent
_KEEP_CODES = 4096  # code objects remembered by a caller (then forgotten: sent again in full)
_KEEP_KNOWN = 65536  # code objects remembered by a callee
_RACE_POLL = 0.001  # seconds between looks for the code a racing request brings (rare)



class _Tls(threading.local):
    dest: str | None = None  # the destination of the request being pickled on this thread
    pending: Any = None  # (dest, [digests], [globals]) to mark sent once the request went out


class _Shipped:
    """Per process: what this rank's pickler remembers of the code it shipped and was
    shipped (its digests are this process's own: a forked child renews them, ``_after_fork``),
    and the caches that spare work per call."""

    def __init__(self) -> None:
        self.fns: dict[int, tuple] = {}  # id(func) -> (func, static parts, digest, names)
        self.by_digest: dict[str, types.FunctionType] = {}  # the original, or the copy built
        self.twins: dict[str, types.FunctionType] = {}  # digest -> this rank's own twin
        self.known: dict[str, tuple] = {}  # digest -> static parts of a function, callee side
        # a C RLock, not a Condition: an interrupt landing in Condition's Python code (an RPC
        # function unpickling a nested call's result) could leave it held (wake_flag.py)
        self.known_lock = threading.RLock()
        self.nonce: list = [os.urandom(6).hex(), itertools.count(1)]  # prefix, counter
        self.tls = _Tls()  # per thread: the request being pickled
        self.classes_whole: weakref.WeakSet = weakref.WeakSet()  # attributes all set here
        self.copies: weakref.WeakSet = weakref.WeakSet()  # functions built from elsewhere
        self.class_copies: weakref.WeakSet = weakref.WeakSet()  # classes built from elsewhere
        self.by_ref: dict[int, tuple[Any, bool]] = {}  # id -> (function or class, by name?)
        self.by_name: dict[int, tuple[str, str]] = {}  # nbdist's wrappers: shipped by name
        self.submodules: dict = {}  # (code, module names) -> (len(sys.modules), found)
        self.table: list = [None, None, -1]  # [owner, table, len(owner._class_reducer_dict)]


_SHIPPED_PER_PROCESS = _Shipped()


class _CodeHeldByPeers:
    """Which of this rank's code the world's other ranks hold, as (destination name, digest):
    a ``world_state`` part, so a new world (or a forked child) starts with none."""

    def __init__(self) -> None:
        self.codes: set[tuple[str, str]] = set()


def _held() -> set[tuple[str, str]]:
    return world_state.part(_CodeHeldByPeers).codes


def _after_fork() -> None:
    """A forked child is a new peer: its own digests, nothing sent, nothing known."""
    shipped = _SHIPPED_PER_PROCESS
    shipped.nonce[:] = [os.urandom(6).hex(), itertools.count(1)]
    shipped.fns.clear()
    shipped.by_digest.clear()
    shipped.twins.clear()
    shipped.known.clear()


os.register_at_fork(after_in_child=_after_fork)


def forget_peers() -> None:
    """A new world: its processes hold none of our code or values yet."""
    _held().clear()
    own_main.forget_peers()


def _static_of(func: types.FunctionType) -> tuple[tuple, str, tuple]:
    """What of ``func`` travels once (code, names, doc, annotations), its digest, and the
    names of the globals its code reads; a new digest whenever any of those changed."""
    shipped = _SHIPPED_PER_PROCESS
    entry = shipped.fns.get(id(func))
    if entry is not None and entry[0] is func:
        old = entry[1]
        if func in shipped.copies:  # a copy built here keeps its origin's digest (fixed code)
            return old, entry[2], entry[3]
        if (old[0] is func.__code__ and old[1] is func.__name__ and old[2] is func.__qualname__
                and old[3] is func.__module__ and old[4] is func.__doc__
                and old[5] is func.__annotations__):
            return old, entry[2], entry[3]
    static = (func.__code__, func.__name__, func.__qualname__, func.__module__, func.__doc__,
              func.__annotations__)
    _make_room()
    digest = f"{shipped.nonce[0]}.{next(shipped.nonce[1])}"  # next() is atomic: never shared
    names = tuple(cloudpickle_private.extract_code_globals(func.__code__))
    shipped.fns[id(func)] = (func, static, digest, names)
    shipped.by_digest[digest] = func
    return static, digest, names


def _make_room() -> None:
    shipped = _SHIPPED_PER_PROCESS
    if len(shipped.fns) >= _KEEP_CODES:
        shipped.fns.clear()
        shipped.by_digest.clear()
        shipped.twins.clear()
        _held().clear()  # a digest we forget may be given again: send its code again too


_EMPTY = cloudpickle_private.EMPTY_CELL


def _dynamic_state(func: types.FunctionType, names: tuple, dest: str | None) -> tuple:
    """What of ``func`` travels on every call: the globals it reads (for a ``__main__``
    function as mirror entries: values this destination holds already go as a marker),
    defaults, closure values, attributes (and the submodules it uses, imported on arrival
    as cloudpickle does)."""
    g = func.__globals__
    if g.get("__name__") == "__main__":
        f_globals: Any = own_main.outgoing(dest, g, names)
        values = [v for _, v in f_globals[1] if v is not own_main.UNCHANGED]
    else:
        f_globals = {k: g[k] for k in names if k in g}
        values = list(f_globals.values())
    closure = func.__closure__
    cells = None if closure is None else tuple(
        cloudpickle_private.get_cell_contents(c) for c in closure)
    if cells:
        values.extend(cells)
    subs = _cached_submodules(func.__code__, values) if values else None
    return (f_globals, func.__defaults__, func.__kwdefaults__, cells, func.__dict__ or None,
            subs or None)


def _set_dynamic(func: types.FunctionType, state: tuple) -> None:
    """Unpickling hook (the state setter of ``_make_new``/``_make_known``): nothing for the
    original (it arrived back where it was defined), else the copy's globals, defaults,
    closure values and attributes."""
    shipped = _SHIPPED_PER_PROCESS
    if func not in shipped.copies:
        return  # the original: its own globals, closure and defaults are the real ones
    f_globals, defaults, kwdefaults, cells, fdict, _subs = state
    if type(f_globals) is tuple:
        own_main.merge(f_globals[0], f_globals[1], func.__globals__)
    else:
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


def _build(digest: str, static: tuple, base_globals: dict | None) -> types.FunctionType:
    """The copy of a function from elsewhere, once per digest: against this rank's
    ``__main__`` (``base_globals`` is None) or, for other modules' code, a dict of its own."""
    shipped = _SHIPPED_PER_PROCESS
    code, name, qualname, module, doc, annotations = static
    if base_globals is None:
        g = own_main.main_namespace()
        own = _own_twin(g, qualname, code)
        if own is not None:
            shipped.twins[digest] = own
            return own
    else:
        g = base_globals
        g["__builtins__"] = builtins
    closure = tuple(types.CellType() for _ in code.co_freevars) if code.co_freevars else None
    func = types.FunctionType(code, g, name, None, closure)
    func.__qualname__ = qualname
    func.__module__ = module
    func.__doc__ = doc
    if annotations:
        func.__annotations__ = dict(annotations)
    with shipped.known_lock:
        hit = shipped.by_digest.get(digest)
        if hit is not None:  # another thread built it meanwhile
            return hit
        _make_room()
        shipped.fns[id(func)] = (func, static, digest, tuple(
            cloudpickle_private.extract_code_globals(code)))
        shipped.by_digest[digest] = func
        shipped.copies.add(func)
    return func


def _own_twin(ns: dict, qualname: str, code: types.CodeType) -> types.FunctionType | None:
    """This rank's own definition standing for a ``__main__`` function from elsewhere
    (``twins``): never a copy built here."""
    shipped = _SHIPPED_PER_PROCESS
    own = per_rank.twin_function(ns, qualname, code)
    return None if own is None or own in shipped.copies else own


def _twin_hit(digest: str, base_globals: dict | None) -> types.FunctionType | None:
    """The twin found for ``digest`` before, while ``__main__`` still binds it."""
    shipped = _SHIPPED_PER_PROCESS
    own = shipped.twins.get(digest)
    if own is None or base_globals is not None:
        return None
    if per_rank.lookup(own_main.main_namespace(), own.__qualname__) is own:
        return own
    shipped.twins.pop(digest, None)  # rebound since: find its twin (or build a copy) again
    return None


def _make_new(digest: str, static: tuple, filename: str, lines: list[str] | None,
              base_globals: dict | None) -> types.FunctionType:
    """Unpickling hook: a function whose code comes with it (the first time to this rank);
    the original itself if it was defined here."""
    shipped = _SHIPPED_PER_PROCESS
    hit = shipped.by_digest.get(digest) or _twin_hit(digest, base_globals)
    if hit is not None:
        return hit
    if lines is not None and filename not in linecache.cache:
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    if digest not in shipped.known:
        with shipped.known_lock:
            if len(shipped.known) >= _KEEP_KNOWN:
                shipped.known.pop(next(iter(shipped.known)))
            shipped.known[digest] = static
    return _build(digest, static, base_globals)


def _make_known(digest: str, base_globals: dict | None) -> types.FunctionType:
    """Unpickling hook: a function whose code this rank was sent before, named by digest."""
    shipped = _SHIPPED_PER_PROCESS
    hit = shipped.by_digest.get(digest) or _twin_hit(digest, base_globals)
    if hit is not None:
        return hit
    static = shipped.known.get(digest)
    if static is None:
        give_up = time.monotonic() + CODE_WAIT
        while (static := shipped.known.get(digest)) is None:  # the racing request, polled
            left = give_up - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"nbdist: the code of a notebook function ({digest}) "
                                   f"never reached this rank within {CODE_WAIT:.0f}s")
            time.sleep(min(left, _RACE_POLL))
    return _build(digest, static, base_globals)


_cp_class_setstate = cloudpickle_private.class_setstate
_cp_skeleton_class = cloudpickle_private.make_skeleton_class
_cp_class_tracker = cloudpickle_private.DYNAMIC_CLASS_TRACKER_BY_ID


def _make_class(key: str, qualname: str, *skeleton: Any) -> type:
    """Unpickling hook for a ``__main__`` class: one this process has seen (its own, coming
    back, or a copy made before) as cloudpickle finds it; else this rank's own twin
    (``twins``), whose attributes stay its own; else a new copy."""
    shipped = _SHIPPED_PER_PROCESS
    if skeleton[4] not in _cp_class_tracker:
        own = per_rank.twin_class(own_main.main_namespace(), qualname, key, skeleton[2])
        if own is not None and own not in shipped.class_copies:
            shipped.classes_whole.add(own)
            return own
        cls = _cp_skeleton_class(*skeleton)
        shipped.class_copies.add(cls)
        return cls
    return _cp_skeleton_class(*skeleton)


def _class_setstate_once(cls: type, state: Any) -> type:
    """Unpickling hook for by-value classes: attributes are set once per process (a class
    that arrived back where it was defined, or again, keeps the attributes it has: class-level
    state is the rank's own, as in a script); a redefined class is a new class."""
    shipped = _SHIPPED_PER_PROCESS
    if cls in shipped.classes_whole:
        return cls
    _cp_class_setstate(cls, state)
    shipped.classes_whole.add(cls)
    return cls


class ShippingPickler(cloudpickle.Pickler):
    """cloudpickle's by-value reducers plus the cell source of each shipped function.

    With ``dest`` set (an RPC request), a by-value function's code goes to ``dest`` once and
    is named by digest afterwards; the digests sent for the first time are in ``new_codes``,
    the notebook globals sent with them in ``new_values``. Locks and their kin reached from
    shipped code travel fresh, unless they are one of ``direct`` (the request's own
    arguments: there the caller meant that very object, which cannot travel).
    """

    dispatch_table = ChainMap({types.CodeType: reduce_code}, cloudpickle.Pickler.dispatch_table)

    def __init__(self, file: Any, protocol: int | None = None,
                 dispatch_table: Any = None, dest: str | None = None,
                 direct: frozenset[int] = frozenset()) -> None:
        # The C pickler reads ``dispatch_table`` once, in __init__, and cloudpickle's class
        # attribute shadows the C-level setter: so it must be in place before __init__.
        if dispatch_table is not None:
            self.dispatch_table = dispatch_table
        super().__init__(file, protocol=protocol)
        self.dest = dest
        self.direct = direct
        self.new_codes: list[str] = []
        self.new_values: list[tuple] = []

    def reducer_override(self, obj: Any) -> Any:
        shipped = _SHIPPED_PER_PROCESS
        t = type(obj)
        if t is types.FunctionType:
            by_name = shipped.by_name.get(id(obj))
            if by_name is not None:
                return (_load_attr, by_name)
            if _by_reference(obj):
                return NotImplemented
            return self._function_by_value(obj)
        if issubclass(t, type):
            hit = shipped.by_ref.get(id(obj))
            if hit is not None and hit[0] is obj:
                return NotImplemented  # only "by reference" is remembered for classes
            rv = super().reducer_override(obj)
            if rv is NotImplemented:
                _remember(obj, True)
                return rv
            if len(rv) < 6 or rv[5] is not _cp_class_setstate:
                return rv  # a builtin type, by cloudpickle's own reducer
            shipped.classes_whole.add(obj)  # defined here (or whole): a copy arriving is not
            # applied
            if rv[0] is _cp_skeleton_class and obj.__module__ == "__main__":
                # the receiver may have its own twin of it
                rv = (_make_class, (per_rank.class_key(obj), obj.__qualname__, *rv[1])) + rv[2:]
            return rv[:5] + (_class_setstate_once,)
        if fresh_locks.is_fresh_kind(t) and id(obj) not in self.direct:
            return fresh_locks.fresh_reduce(obj)
        return NotImplemented

    def _function_by_value(self, obj: types.FunctionType) -> Any:
        dest = self.dest
        static, digest, names = _static_of(obj)
        g = obj.__globals__
        if g.get("__name__") == "__main__":
            base = None  # rebuilt against the receiving rank's own __main__
        else:
            base = self.globals_ref.get(id(g))  # shared by this pickle's functions
            if base is None:
                base = self.globals_ref[id(g)] = {k: g[k] for k in _BASE_KEYS if k in g}
        state = _dynamic_state(obj, names, dest)
        if dest is not None:
            if type(state[0]) is tuple and any(v is not own_main.UNCHANGED
                                               for _, v in state[0][1]):
                self.new_values.append(state[0][1])
            if (dest, digest) in _held():
                return (_make_known, (digest, base), state, None, None, _set_dynamic)
            self.new_codes.append(digest)
        filename = static[0].co_filename
        return (_make_new, (digest, static, filename, _cell_source(filename), base), state,
                None, None, _set_dynamic)


_BASE_KEYS = ("__package__", "__name__", "__path__", "__file__")


def _remember(obj: Any, verdict: bool) -> None:
    shipped = _SHIPPED_PER_PROCESS
    if len(shipped.by_ref) >= _KEEP_CODES:
        shipped.by_ref.clear()
    shipped.by_ref[id(obj)] = (obj, verdict)


def _by_reference(func: types.FunctionType) -> bool:
    """cloudpickle's "importable by name?" verdict, remembered per function object (the
    entry holds the function, so its id cannot be reused while it is remembered)."""
    shipped = _SHIPPED_PER_PROCESS
    hit = shipped.by_ref.get(id(func))
    if hit is not None and hit[0] is func:
        return hit[1]
    verdict = cloudpickle_private.should_pickle_by_reference(func)
    _remember(func, verdict)
    return verdict


def dumps(obj: Any) -> bytes:
    """Pickle with the shipping rules (used by ``%%dist`` and the tests)."""
    buf = io.BytesIO()
    ShippingPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()




def _dispatch_table(owner: Any) -> dict:
    """torch's RPC reducers (tensors, RRefs) over cloudpickle's, merged once into a plain dict
    (a ChainMap would cost a Python call per pickled object); rebuilt when torch registers a
    new class reducer."""
    shipped = _SHIPPED_PER_PROCESS
    n = len(owner._class_reducer_dict)
    if shipped.table[0] is owner and shipped.table[2] == n:
        return shipped.table[1]
    import torch
    import torch.distributed as dist

    table = dict(ShippingPickler.dispatch_table)  # cloudpickle's, with code keeping its name
    table.update(owner._dispatch_table)
    table[torch.Tensor] = shm.tensor_reducer(owner._dispatch_table[torch.Tensor])
    table[dist.rpc.PyRRef] = owner._py_rref_reducer
    table[dist.rpc.RRef] = owner._rref_reducer
    table[types.MethodType] = _reduce_method
    table.update(owner._class_reducer_dict)
    shipped.table[:] = [owner, table, n]
    return table


def _rpc_pickler(owner: Any, f: io.BytesIO, obj: Any, dest: str | None = None,
                 direct: frozenset[int] = frozenset()) -> ShippingPickler:
    """A ShippingPickler with torch's RPC reducers (tensors, RRefs, ScriptModules) in front."""
    table = _dispatch_table(owner)
    script_module = _TORCH_PER_PROCESS.ScriptModule
    if script_module is not None and isinstance(obj, script_module):
        table = {**table, obj.__class__: owner._script_module_reducer}
    return ShippingPickler(f, protocol=pickle.HIGHEST_PROTOCOL, dispatch_table=table, dest=dest,
                           direct=direct)


class _TorchNames:
    """Per process: what the RPC pickler compares with and writes to, taken from torch once
    ``install`` patches it."""

    ScriptModule: Any = None
    PythonUDF: Any = None
    thread_tables: Any = None  # torch's thread-local tensor tables


_TORCH_PER_PROCESS = _TorchNames()


def _serialize(self: Any, obj: Any) -> tuple[bytes, list]:
    """Drop-in for ``_InternalRPCPickler.serialize`` (same tensor-table protocol)."""
    shipped = _SHIPPED_PER_PROCESS
    tables = _TORCH_PER_PROCESS.thread_tables
    old = getattr(tables, "send_tables", None)
    tables.send_tables = []
    tls = shipped.tls
    tls.pending = None
    if type(obj) is _TORCH_PER_PROCESS.PythonUDF:  # a request: code once per peer
        dest = tls.dest
        direct = frozenset(map(id, (*(obj.args or ()), *(obj.kwargs or {}).values())))
    else:
        dest, direct = None, frozenset()
    tls.dest = None
    f = io.BytesIO()
    outer = shm.begin(dest)  # large tensors to a rank on this host: through shared memory
    tensors = None
    try:
        pickler = _rpc_pickler(self, f, obj, dest, direct)
        try:
            pickler.dump(obj)
        except Exception as exc:
            raise _explain_unpicklable(self, obj, exc, dest) from exc
        tensors = tables.send_tables
    finally:
        try:
            shm.end(outer, tensors)  # copies them into the arena, or restores on failure
        finally:
            if old is not None:
                tables.send_tables = old
            else:
                del tables.send_tables
    if pickler.new_codes or pickler.new_values:
        tls.pending = (dest, pickler.new_codes, pickler.new_values)
    return f.getvalue(), tensors


def _wrap_to_worker_info(orig: Callable) -> Callable:
    """torch resolves the destination right before it pickles a request: remember it."""
    tls = _SHIPPED_PER_PROCESS.tls

    def _to_worker_info(to: Any) -> Any:
        info = orig(to)
        tls.dest = info.name
        return info

    return _to_worker_info


def _sent() -> None:
    """A request went out (``rpc_calls`` calls this after each Python-UDF send): its
    destination holds the code it carried."""
    tls = _SHIPPED_PER_PROCESS.tls
    pending = tls.pending
    if pending is not None:
        tls.pending = None
        dest, digests, values = pending
        held = _held()
        for d in digests:
            held.add((dest, d))
        for entries in values:
            own_main.mark_sent(dest, entries)


def _explain_unpicklable(owner: Any, obj: Any, exc: Exception, dest: str | None = None
                         ) -> Exception:
    """Name the argument (or function, or return value) that could not be pickled; for
    the function, the global that could not travel and the chain of code that reached it.
    The error is of the type plain torch raises (``exc``'s), with ``exc``'s text in it."""
    from torch.distributed.rpc.internal import PythonUDF

    if not isinstance(obj, PythonUDF):
        return _like(exc, f"the RPC result could not be pickled to send back: {exc}")
    fname = getattr(obj.func, "__qualname__", repr(obj.func))

    def can_pickle(value: Any, direct: frozenset[int] = frozenset()) -> Exception | None:
        try:
            _rpc_pickler(owner, io.BytesIO(), value, direct=direct).dump(value)
        except Exception as inner:  # noqa: BLE001 - any failure is the answer
            return inner
        return None

    error = can_pickle(obj.func)
    if error is not None:
        found = unpicklable.find(obj.func, can_pickle, _travels_by_value)
        if found is not None:
            where = f" to {dest}" if dest else ""
            return _like(exc,
                f"{found.path}: the global {found.name!r} ({type(found.value).__name__}) "
                f"cannot be sent{where}: {found.error}. Each rank has its own __main__: make "
                f"the object on the rank that uses it (inside the function, or in a %%dist "
                f"cell) instead of in a notebook global (locks, events, queues and semaphores "
                f"are made fresh on each rank by themselves)")
        return _like(exc, f"the function of the RPC to {fname} ({type(obj.func).__name__}) "
                          f"cannot be pickled: {error}")
    parts = [(f"argument {i}", a) for i, a in enumerate(obj.args or ())]
    parts += [(f"keyword argument {k!r}", v) for k, v in (obj.kwargs or {}).items()]
    for label, value in parts:
        inner = can_pickle(value, frozenset({id(value)}))  # as the request pickled it
        if inner is not None:
            return _like(exc, f"{label} of the RPC to {fname} ({type(value).__name__}) cannot "
                              f"be pickled: {exc}. Send something picklable instead (for a "
                              "lock, file or socket, create it on the worker)")
    return _like(exc, f"the RPC to {fname} could not be pickled: {exc}")


def _like(exc: Exception, message: str) -> Exception:
    """An exception of ``exc``'s type saying ``message`` (a ``TypeError`` where that type
    cannot be made from one message): code that catches what torch raises still catches it."""
    try:
        made = type(exc)(message)
    except Exception:  # noqa: BLE001 - a constructor that wants other arguments
        return TypeError(message)
    return made if str(made) == message else TypeError(message)


def _travels_by_value(obj: Any) -> bool:
    """Whether a function or class is pickled by value (its insides travel)."""
    shipped = _SHIPPED_PER_PROCESS
    if isinstance(obj, types.FunctionType):
        return id(obj) not in shipped.by_name and not _by_reference(obj)
    return not cloudpickle_private.should_pickle_by_reference(obj)


def install() -> None:
    """Make torch RPC ship notebook-defined code by value in this process (idempotent); every
    call (each new world) also forgets which code the peers hold."""
    forget_peers()
    if not torch_private.usable("shipping") or not first_time("shipping"):
        return
    import torch
    from torch.distributed.rpc import internal

    names = _TORCH_PER_PROCESS
    names.ScriptModule = torch.jit.ScriptModule
    names.PythonUDF = internal.PythonUDF
    names.thread_tables = rpc_calls.install_shipping(_serialize, _wrap_to_worker_info, _sent)
    shm.use_tables(names.thread_tables)


def uninstall() -> list[str]:
    """torch's RPC pickles with its own pickler again; what stayed (another feature's wrapper
    on top: uninstall that first)."""
    left = rpc_calls.uninstall_shipping()
    if not left:
        forget("shipping")
    return left


def installed() -> bool:
    """Whether ``install`` ran in this process."""
    return has("shipping")
