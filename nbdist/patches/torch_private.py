"""Every private torch and cloudpickle name nbdist patches or reads, looked up once, here.

torch's RPC is in maintenance mode upstream, but its private names still move between releases.
``PRIVATES`` lists each name nbdist relies on with the feature that needs it, a check of its shape
and the torch versions (cloudpickle's: ``CLOUDPICKLE_VERIFIED``) it was verified on
(docs/torch-versions.md). ``problems()`` looks them all up
once per process; ``%load_ext nbdist`` (or, while torch is not imported yet, the first world
start) prints one line per feature that cannot work on the torch at hand. Patch modules ask
``usable`` before they patch, so a missing or reshaped name turns one feature off instead of
crashing the start. ``tests/unit/test_torch_pins.py`` pins this list and checks that every private
name the package's source reaches into is listed here.
"""

from __future__ import annotations

import importlib
import inspect
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from typing import Any

from .features import FEATURES
from .installed import first_time

__all__ = ["CLOUDPICKLE_VERIFIED", "FEATURES", "PRIVATES", "VERIFIED", "Private", "problems",
           "report", "report_once", "usable"]

# torch versions the suite passed on, oldest first: pyproject.toml accepts exactly this range
# and CI runs the fast suite on both ends (docs/torch-versions.md says which suite ran on
# each); entries verified on fewer say so in their own ``verified``.
VERIFIED = ("2.8.0", "2.9.0", "2.10.0", "2.11.0", "2.13.0", "2.14.1", "2.15.0")
# cloudpickle versions the suite passed on, oldest first: pyproject.toml accepts from the
# oldest up to the newest's next minor (its private names move in minor releases)
CLOUDPICKLE_VERIFIED = ("3.1.3",)


@dataclass(frozen=True)
class Private:
    """One private torch name: ``module`` then ``attr`` (dotted for an attribute of an
    attribute), the feature that needs it, and what it must look like."""

    feature: str
    module: str
    attr: str
    check: Callable[[Any], bool] = callable
    verified: tuple[str, ...] = VERIFIED
    lookup: Callable[[], Any] | None = None  # for what is not a Python attribute

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attr}"


def _arity(n: int) -> Callable[[Any], bool]:
    """A check: callable with ``n`` positional parameters (pybind functions: from the
    signature line of their docstring)."""
    def check(obj: Any) -> bool:
        if not callable(obj):
            return False
        try:
            params = inspect.signature(obj).parameters.values()
            return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                       for p in params) == n
        except (TypeError, ValueError):
            pass
        line = (getattr(obj, "__doc__", None) or "").split("\n", 1)[0]
        start = line.find("(")
        if start < 0:
            return False
        depth, count, empty = 0, 1, True
        for ch in line[start + 1:]:
            if ch in "([":
                depth += 1
            elif ch in ")]":
                if depth == 0:
                    break
                depth -= 1
            elif ch == "," and depth == 0:
                count += 1
            elif not ch.isspace():
                empty = False
        return (0 if empty else count) == n

    return check


def _is(*kinds: type) -> Callable[[Any], bool]:
    return lambda obj: isinstance(obj, kinds)


def _lock(obj: Any) -> bool:
    return hasattr(obj, "acquire") and hasattr(obj, "release")


def _defaultdict(obj: Any) -> bool:
    import collections

    return isinstance(obj, collections.defaultdict)


def _thread_local(obj: Any) -> bool:
    return isinstance(obj, threading.local)


def _python_udf(obj: Any) -> bool:
    return getattr(obj, "_fields", None) == ("func", "args", "kwargs")


def _async_marker() -> Any:
    import torch.distributed.rpc as rpc

    @rpc.functions.async_execution
    def probe() -> None:
        pass

    return getattr(probe, "_wrapped_async_rpc_function", None)


def _rref_symbols() -> Any:
    from . import rref_reset

    return rref_reset.available() or None


def _keeps_rendezvous() -> Any:
    """True where ``init_rpc`` keeps its rendezvous (and so its store) in a module global."""
    from torch.distributed import rpc

    return "global rendezvous_iterator" in inspect.getsource(rpc.init_rpc) or None


def _barrier_symbol() -> Any:
    from . import rpc_barrier

    return rpc_barrier.available() or None


def _globals_ref() -> Any:
    """cloudpickle's per-pickler dict of the globals by-value functions share."""
    import io

    import cloudpickle

    return cloudpickle.Pickler(io.BytesIO()).globals_ref


def _tp_symbols() -> Any:
    from . import tp_address

    return tp_address.available() or None


_RPC = "torch.distributed.rpc"
_API = "torch.distributed.rpc.api"
_INTERNAL = "torch.distributed.rpc.internal"
_C = "torch._C._distributed_rpc"
_C10D = "torch.distributed.distributed_c10d"
_CP = "cloudpickle.cloudpickle"
_CP_OK = CLOUDPICKLE_VERIFIED

PRIVATES: tuple[Private, ...] = (
    # shipping: the RPC pickler swapped for a by-value one, code sent once per destination
    Private("shipping", _INTERNAL, "_internal_rpc_pickler.serialize", _arity(1)),
    Private("shipping", _INTERNAL, "_internal_rpc_pickler._dispatch_table", _is(dict)),
    Private("shipping", _INTERNAL, "_internal_rpc_pickler._class_reducer_dict", _is(dict)),
    Private("shipping", _INTERNAL, "_internal_rpc_pickler._py_rref_reducer", _arity(1)),
    Private("shipping", _INTERNAL, "_internal_rpc_pickler._rref_reducer", _arity(1)),
    Private("shipping", _INTERNAL, "_internal_rpc_pickler._script_module_reducer", _arity(1)),
    Private("shipping", _INTERNAL, "_thread_local_tensor_tables", _thread_local),
    Private("shipping", _INTERNAL, "PythonUDF", _python_udf),
    Private("shipping", _API, "_to_worker_info", _arity(1)),
    Private("shipping", _API, "_invoke_rpc_python_udf", _arity(5)),
    Private("shipping", _API, "_invoke_remote_python_udf", _arity(5)),
    # ... over cloudpickle's by-value machinery (shipping.pickler, shipping.unpicklable)
    Private("shipping", _CP, "_find_imported_submodules", _arity(2), _CP_OK),
    Private("shipping", _CP, "_extract_code_globals", _arity(1), _CP_OK),
    Private("shipping", _CP, "_get_cell_contents", _arity(1), _CP_OK),
    Private("shipping", _CP, "_empty_cell_value", lambda obj: obj is not None, _CP_OK),
    Private("shipping", _CP, "_class_setstate", _arity(2), _CP_OK),
    Private("shipping", _CP, "_make_skeleton_class", _arity(6), _CP_OK),
    Private("shipping", _CP, "_DYNAMIC_CLASS_TRACKER_BY_ID", _is(weakref.WeakValueDictionary),
            _CP_OK),
    Private("shipping", _CP, "_should_pickle_by_reference", _arity(2), _CP_OK),
    Private("shipping", _CP, "Pickler.globals_ref", _is(dict), _CP_OK, lookup=_globals_ref),
    # thread_states: every thread that unpickles an RPC message keeps its Python state
    Private("thread_states", _INTERNAL, "_internal_rpc_pickler.deserialize", _arity(2)),
    # callee: RPC functions registered while they run (interrupts, output before the reply),
    # and a relayed view call run on its rank as one (``rpc_hooks.run_as_rpc_function``)
    Private("callee", _INTERNAL, "_run_function", _arity(1)),
    Private("callee", _INTERNAL, "RemoteException", _is(type)),
    Private("callee", _INTERNAL, "PythonUDF", _python_udf),
    Private("callee", _C, "_get_current_rpc_agent", _arity(0)),
    # caller: an interruptible rpc_sync
    Private("caller", _API, "_invoke_rpc", _arity(6)),
    Private("caller", _API, "_require_initialized", _arity(1)),
    Private("caller", _API, "RPCExecMode.SYNC", lambda obj: obj is not None),
    # restart: the per-process counters that make a second init_rpc hang
    Private("restart", _RPC, "_init_counter", _is(int)),
    Private("restart", _RPC, "_init_counter_lock", _lock),
    Private("restart", _RPC, "rendezvous_iterator", lambda obj: obj is True,
            lookup=_keeps_rendezvous),
    Private("restart", _API, "_all_gather_dict_lock", _lock),
    Private("restart", _API, "_all_gather_sequence_id", _is(dict)),
    Private("restart", _API, "_all_gather_sequence_id_to_states", _defaultdict),
    # ... and where init_rpc builds its Gloo group and first uses it: a failed start's join
    # left waiting there is recognised by these frames (cluster.session._abandon_in_gloo)
    Private("restart", "torch.distributed.rpc.backend_registry", "_init_process_group",
            _arity(3)),
    Private("restart", "torch.distributed.rpc.backend_registry",
            "_tensorpipe_exchange_and_check_all_device_maps", _arity(5)),
    # rerun: a cell's own init_rpc starts as a fresh process's; its agent ends if it fails
    Private("rerun", _API, "_is_current_rpc_agent_set", _arity(0)),
    Private("rerun", _API, "_get_current_rpc_agent", _arity(0)),
    Private("rerun", _API, "_ignore_rref_leak", _is(bool)),
    Private("rerun", "torch.distributed.autograd", "_current_context", _arity(0)),
    Private("rerun", "torch.distributed.autograd", "_release_context", _arity(1)),
    # C++ statics found in libtorch_cpu.so's symbol table
    Private("rref_reset", "libtorch_cpu.so", "RRefContext::getInstance()::context",
            lambda obj: obj is True, lookup=_rref_symbols),
    Private("restart", "libtorch_cpu.so", "rpc::barrierId", lambda obj: obj is True,
            lookup=_barrier_symbol),
    Private("tp_address", "libtorch_cpu.so", "TensorPipeAgent::guessAddress()::uvAddress",
            lambda obj: obj is not None, lookup=_tp_symbols),
    # tracing: torch's RPC entry points wrapped to time each call
    Private("tracing", _API, "PythonUDF", _python_udf),
    Private("tracing", _API, "_invoke_rpc_python_udf", _arity(5)),
    Private("tracing", _API, "_invoke_remote_python_udf", _arity(5)),
    Private("tracing", _API, "_invoke_rpc_builtin"),
    Private("tracing", _API, "_invoke_remote_builtin"),
    Private("tracing", _API, "_invoke_rpc_torchscript"),
    Private("tracing", _API, "_invoke_remote_torchscript"),
    Private("tracing", "torch.distributed.rpc.rref_proxy", "_local_invoke", _arity(4)),
    Private("tracing", "torch.distributed.rpc.rref_proxy", "_local_invoke_async_execution",
            _arity(4)),
    Private("tracing", _C, "PyRRef.to_here"),
    # the rest: read, not patched
    Private("start_timeout", "torch.distributed.rpc.constants", "DEFAULT_PROCESS_GROUP_TIMEOUT",
            _is(timedelta)),
    Private("rpc_timeout", _RPC, "_set_rpc_timeout", _arity(1)),
    Private("current_agent", _API, "_is_current_rpc_agent_set", _arity(0)),
    Private("current_agent", _API, "_get_current_rpc_agent", _arity(0)),
    Private("async_marker", "torch.distributed.rpc.functions", "_wrapped_async_rpc_function",
            lookup=_async_marker),  # the decorated function's marker: the function itself
    # no_rpc: what _require_initialized's wrapper asks, answered with NoRpcError (patches.no_rpc)
    Private("no_rpc", _API, "_require_initialized", _arity(1)),
    Private("no_rpc", _API, "_is_current_rpc_agent_set", _arity(0)),
    # process_group: every group a destroy_process_group() ends, kept alive (groups.graveyard)
    Private("process_group", "torch.distributed.distributed_c10d", "_world.pg_map", _is(dict)),
    # ... and the per-process count that names a default group (a failed init leaves it up)
    Private("process_group", "torch.distributed.distributed_c10d", "_world.group_count",
            _is(int)),
    # hidden_groups: torch's books on this process's groups, emptied while a spawned
    # function runs and filled again after (patches.hidden_groups)
    *(Private("hidden_groups", _C10D, f"_world.{book}", _is(dict))
      for book in ("pg_names", "pg_group_ranks", "pg_backend_config", "pg_to_tag",
                   "tags_to_pg", "pg_coalesce_state")),
    # (_world.comms, a list on torch >= 2.9 and absent on 2.8, is saved and emptied where it
    # is there: hidden_groups reads it with getattr)
    Private("hidden_groups", _C10D, "_update_default_pg", _arity(1)),
    Private("hidden_groups", "torch._C._distributed_c10d", "_register_process_group"),
    Private("hidden_groups", "torch._C._distributed_c10d", "_unregister_process_group"),
)

_LOCK_PER_PROCESS = threading.Lock()


def _look(p: Private) -> str | None:
    """What is wrong with ``p`` on this torch, or None."""
    try:
        if p.lookup is not None:
            obj = p.lookup()
        else:
            obj = importlib.import_module(p.module)
            for part in p.attr.split("."):
                obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return "missing"
    except Exception as exc:  # noqa: BLE001 - a lookup must never break the start
        return f"unreadable ({type(exc).__name__})"
    try:
        return None if p.check(obj) else "changed shape"
    except Exception:  # noqa: BLE001
        return "changed shape"


def problems() -> list[tuple[Private, str]]:
    """Every listed name that is missing or changed on this torch (looked up once)."""
    with _LOCK_PER_PROCESS:
        return _looked_up()


@cache
def _looked_up() -> list[tuple[Private, str]]:
    return [(p, wrong) for p in PRIVATES if (wrong := _look(p)) is not None]


def usable(feature: str) -> bool:
    """Whether every private name ``feature`` needs is there, in the shape nbdist knows."""
    if feature not in FEATURES:
        raise KeyError(f"unknown feature {feature!r}")
    return not any(p.feature == feature for p, _ in problems())


def report() -> list[str]:
    """One line per feature that degrades on this torch (what is lost, and which names),
    and one if this torch is not among the versions the suite was run on."""
    import torch
    import torch.distributed.rpc as rpc

    version = torch.__version__.split("+")[0]
    if not rpc.is_available():  # none of the names can be there: one line, not one a feature
        return [f"nbdist: torch {version} has no torch.distributed.rpc: worlds start without "
                "RPC (as with --no-rpc), with a process group and everything else nbdist does"]
    lines = []
    for feature, lost in FEATURES.items():
        bad = [f"{p.name} {wrong}" for p, wrong in problems() if p.feature == feature]
        if bad:
            lines.append(f"nbdist: {lost} on torch {version} ({'; '.join(bad)})")
    if version not in VERIFIED:
        lines.append(f"nbdist: torch {version} is not among the versions nbdist was tested on "
                     f"({', '.join(VERIFIED)}); `make test TORCH={version}` checks it")
    import cloudpickle

    if cloudpickle.__version__ not in CLOUDPICKLE_VERIFIED:
        lines.append(f"nbdist: cloudpickle {cloudpickle.__version__} is not among the versions "
                     f"nbdist was tested on ({', '.join(CLOUDPICKLE_VERIFIED)})")
    return lines


def report_once() -> list[str]:
    """``report()`` the first time it is called in this process, nothing afterwards."""
    return report() if first_time("torch_private.report") else []
