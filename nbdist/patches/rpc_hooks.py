"""Small, pinned patches to torch.distributed.rpc that a notebook needs.

- ``rpc_sync`` on the main thread waits interruptibly and fails early with ``WorkerDiedError``
  when the destination rank is known dead.
- Every Python function an RPC runs here is registered while it runs, so an interrupt can reach
  it (``interrupt_rpc_threads``); the bookkeeping is interrupt-proof.
- ``reset_world_state`` clears the counters that make a second ``init_rpc`` hang.

Private torch names: ``tests/unit/test_torch_pins.py`` fails loudly if an upgrade moves them.
"""

from __future__ import annotations

import collections
import functools
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .. import world_state
from ..thread_raise import clear_pending, raise_in
from . import torch_private
from .installed import first_time, forget, has, hooks
from .replaced import replace, restore
from .thread_states import pin

__all__ = [
    "WorldHooks",
    "attach",
    "detach",
    "install_callee",
    "install_caller",
    "interrupt_rpc_threads",
    "last_failed_destination",
    "release_gathers",
    "reset_world_state",
    "run_as_rpc_function",
    "set_on_failure",
    "uninstall_callee",
    "uninstall_caller",
    "wait_future",
]

# thread id -> tokens of the RPC functions it runs now. Injections happen under the lock, so a
# thread that has left (under the lock too) and dropped its pending interrupt gets no other.
# Re-entrant: a worker's SIGINT handler may run again, inside itself, on the main thread.
_ACTIVE_LOCK_PER_PROCESS = threading.RLock()
_ACTIVE_PER_PROCESS: dict[int, set[object]] = {}
#: threads an interrupt was injected into that have not dropped it yet
_HIT_PER_PROCESS: set[int] = set()

class WorldHooks(Protocol):
    """What rank 0's RPC calls ask of the world they run in (``dest``: a rank, name or
    WorkerInfo). A lower layer cannot import the cluster, so the world attaches itself."""

    def check_dest(self, dest: Any) -> None:
        """Raise when ``dest`` is known dead (called often while an RPC is waited for)."""

    def interrupted(self, dest: Any, fut: Any = None) -> None:
        """Ctrl-C stopped the wait for ``fut`` on ``dest``."""

    def replied(self, dest: Any) -> None:
        """An ``rpc_sync`` to ``dest`` returned or raised; its caller goes on after this."""

    def locate(self, dest: Any) -> str | None:
        """``rank 3 (worker3) on node2`` for a destination on another host, else None."""


@dataclass
class _Watched:
    """The world rank 0's RPC calls consult (a ``world_state`` part: it ends with the world,
    before torch's shutdown)."""

    world: WorldHooks | None = None

    def close(self) -> None:
        self.world = None


def _attached() -> WorldHooks | None:
    watched = world_state.peek(_Watched)
    return watched.world if watched is not None else None


def attach(world: WorldHooks) -> None:
    """From now on rank 0's RPC calls consult ``world`` (until ``detach`` or its end)."""
    world_state.part(_Watched).world = world


def detach() -> None:
    """No world: RPC calls wait as torch's own do (interruptibly) and consult nothing."""
    watched = world_state.peek(_Watched)
    if watched is not None:
        watched.close()


class _LastFailed:
    """Where the last ``rpc_sync`` that raised in this world was sent (a ``world_state``
    part)."""

    to: Any = None


def last_failed_destination() -> Any:
    """Where the last ``rpc_sync`` that raised was sent (for ``%dist_debug``'s default)."""
    last = world_state.peek(_LastFailed)
    return last.to if last is not None else None


def set_on_failure(hook: Callable[[BaseException, Any], None] | None) -> None:
    """``hook(exc, traceback)`` is told of each exception an RPC function on this rank raised
    (the worker keeps the last one for post-mortem debugging)."""
    hooks().on_failure = hook


def wait_future(fut: Any, dest: Any = None, poll: float = 0.1) -> Any:
    """``fut.wait()`` that Ctrl-C can interrupt and that notices a dead destination.

    torch's own wait blocks in C++, where no signal handler runs; here the main thread waits
    on a plain lock the future's callback releases (lock waits are interruptible on POSIX).
    Wherever Ctrl-C lands after the RPC was sent, the destination is told (``on_interrupt``),
    so its work stops too.
    """
    if not fut.done() and threading.current_thread() is threading.main_thread():
        _wait_interruptibly(fut, dest, poll)
    try:
        return fut.wait()
    except RuntimeError as exc:  # also when it had failed before the wait began
        _explain_transport_error(exc, dest)
        _explain_missing_module(exc, dest)
        raise


def _wait_interruptibly(fut: Any, dest: Any, poll: float) -> None:
    """Return once ``fut`` is done; Ctrl-C and a dead ``dest`` raise meanwhile."""
    gate = threading.Lock()
    gate.acquire()
    try:
        def opened(_f: Any) -> None:  # on torch's thread; its Python state is kept
            gate.release()
            pin()

        fut.add_done_callback(opened)
        world = _attached()
        if world is not None and dest is not None:
            world.check_dest(dest)  # now too: the notebook attends a breakpoint hit at once
        while not gate.acquire(timeout=poll):
            world = _attached()
            if world is not None and dest is not None:
                world.check_dest(dest)
    except KeyboardInterrupt:
        _tell_interrupted(dest, fut)
        raise


def _tell_interrupted(dest: Any, fut: Any = None) -> None:
    """Tell the world once, to the end, even if Ctrl-C is pressed again meanwhile (the caller
    raises KeyboardInterrupt anyway; a hook cut short would leave remote work on)."""
    world = _attached()
    if world is None or dest is None:
        return
    for _ in range(3):
        try:
            world.interrupted(dest, fut)
            return
        except KeyboardInterrupt:
            continue


def _tell_replied(dest: Any) -> None:
    """Tell the world an RPC to ``dest`` ended (it keeps its own short deadline)."""
    world = _attached()
    if world is not None:
        world.replied(dest)


_MISSING = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")


def _explain_missing_module(exc: BaseException, dest: Any) -> None:
    """A module the destination cannot import, on another host: say which module and host."""
    world = _attached()
    where = world.locate(dest) if world is not None and dest is not None else None
    found = _MISSING.search(str(exc))
    if where and found:
        raise ModuleNotFoundError(
            f"{where} cannot import module {found.group(1)!r}, which this call needs (it "
            "travels by reference, as an import): install it on that host, or put it where "
            "the host's Python finds it (a shared filesystem)", name=found.group(1)) from exc


_TRANSPORT = ("eof", "pipe closed", "connection reset", "connection closed", "broken pipe")


def _explain_transport_error(exc: BaseException, dest: Any, grace: float = 2.0) -> None:
    """A connection error from a peer that has died becomes a WorkerDiedError naming it."""
    world = _attached()
    if world is None or dest is None or not any(t in str(exc).lower() for t in _TRANSPORT):
        return
    give_up = time.monotonic() + grace  # the exit status follows the closed pipe closely
    while time.monotonic() < give_up:
        try:
            world.check_dest(dest)
        except Exception as died:
            raise died from exc
        time.sleep(0.02)


_NO_MAP = "TensorPipe RPC backend only supports CPU tensors"


def _explain_cuda_tensor(exc: BaseException) -> None:
    """torch's refusal to send a CUDA tensor without device maps, with nbdist's flag in it."""
    if _NO_MAP in str(exc):
        raise RuntimeError(
            "a CUDA tensor cannot travel over RPC in this world: it has no device maps. Start "
            "it with `--device-maps auto` (`%dist_restart --device-maps auto`, or "
            "nbdist.start(..., device_maps='auto')) so tensors go GPU to GPU, or send "
            f"tensor.cpu(). torch said: {exc}") from exc


def _explained(fn: Callable) -> Callable:
    """``fn`` (``rpc_async``, ``remote``) with ``_explain_cuda_tensor`` on what it raises."""
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RuntimeError as exc:
            _explain_cuda_tensor(exc)
            raise

    return call


def install_caller() -> None:
    """Route ``rpc.rpc_sync`` through ``wait_future`` (idempotent); ``rpc_sync``,
    ``rpc_async`` and ``remote`` name ``--device-maps`` when a CUDA tensor has no map."""
    if not torch_private.usable("caller") or not first_time("rpc_hooks.caller"):
        return
    import torch.distributed.rpc as rpc
    from torch.distributed.rpc import api
    from torch.distributed.rpc.constants import UNSET_RPC_TIMEOUT

    original = api.rpc_sync

    record = hooks()  # one object for the process's life: read its field inline

    @api._require_initialized
    def rpc_sync(to, func, args=None, kwargs=None, timeout: float = UNSET_RPC_TIMEOUT):
        timing = record.sync_timing  # tracing's timing: in this one wrapper, not one more
        timed = False
        if timing is not None and timing.switch.on:
            tls = timing.tls
            if not tls.paused:
                tls.sync = timed = True
        try:
            try:
                fut = api._invoke_rpc(to, func, api.RPCExecMode.SYNC, args, kwargs, timeout)
            except RuntimeError as exc:
                _explain_cuda_tensor(exc)
                _explain_transport_error(exc, to)
                raise
            try:
                value = wait_future(fut, to)
            except KeyboardInterrupt:
                raise  # Ctrl-C returns at once; the output follows when it comes
            except BaseException:
                world_state.part(_LastFailed).to = to
                try:
                    _tell_replied(to)
                except KeyboardInterrupt:
                    pass  # the call's own error is what the caller sees
                raise
            _tell_replied(to)  # Ctrl-C here raises, as it would a moment later
            return value
        finally:
            if timed:
                timing.end()

    rpc_sync.__doc__ = original.__doc__
    rpc_sync.__wrapped__ = original  # type: ignore[attr-defined]
    for module in (api, rpc):
        replace("caller", module, "rpc_sync", rpc_sync)
    for name in ("rpc_async", "remote"):
        wrapped = _explained(getattr(api, name))
        for module in (api, rpc):
            replace("caller", module, name, wrapped)


def uninstall_caller() -> list[str]:
    """torch's own ``rpc_sync``, ``rpc_async`` and ``remote`` again; what stayed in place
    (another feature's wrapper on top: uninstall that first)."""
    left = restore("caller")
    if not left:
        forget("rpc_hooks.caller")
    return left


def install_callee(after_call: Callable[[], None] | None = None) -> None:
    """Track the threads that run Python RPC functions on this rank (idempotent).

    ``after_call`` runs when each function returns, before the reply is sent (workers use it
    to flush printed output, so it reaches the notebook ahead of the RPC's result).
    """
    if after_call is not None:
        hooks().after_call = after_call
    if not torch_private.usable("callee") or not first_time("rpc_hooks.callee"):
        return
    from torch.distributed.rpc import internal

    replace("callee", internal, "_run_function", _run_function)


def uninstall_callee() -> list[str]:
    """torch's own ``_run_function`` again; what stayed in place."""
    left = restore("callee")
    if not left:
        forget("rpc_hooks.callee")
    return left


def _run_function(python_udf: Any) -> Any:
    """torch's ``internal._run_function``, registered in ``_ACTIVE_PER_PROCESS`` while the
    function runs.

    An interrupt (``interrupt_rpc_threads``) may land on any bytecode here. Registering happens
    inside the ``try``; leaving is idempotent and retried when a second interrupt cuts it;
    once left, the thread is no longer a target and its pending interrupt is dropped, so
    ``after_call`` and the reply run undisturbed. Unlike torch's own version this one prints an
    exception to the callee's stderr only where user code redirected it: the caller gets it
    raised anyway, so in a notebook it would show twice.
    """
    tid = threading.get_ident()
    token = object()
    failure: BaseException | None = None
    value = None
    try:
        _enter(tid, token)
        if isinstance(python_udf, AttributeError):
            raise python_udf
        value = python_udf.func(*python_udf.args, **python_udf.kwargs)
    except (Exception, KeyboardInterrupt) as exc:
        failure = exc
    finally:
        # Unrolled on purpose: a loop's back edge is a point where an interrupt can land
        # outside any ``try``; nested handlers have none (each try covers the whole call).
        try:
            _leave(tid, token)
        except KeyboardInterrupt:
            try:
                _leave(tid, token)
            except KeyboardInterrupt:
                try:
                    _leave(tid, token)
                except KeyboardInterrupt:
                    _leave(tid, token)
    _call_after_call()
    if failure is not None:
        return _remote_exception(failure)
    return value


def run_as_rpc_function(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Run ``fn`` on this thread as this rank's RPC server runs a Python function (registered
    for interrupts, ``after_call`` after it) and return its value, or raise its failure as
    ``rpc_sync``'s caller would see it: torch's type, the text naming this rank and the
    remote traceback. ``NotImplemented`` (nothing run) when the callee patch is not
    installed or ``fn`` is an ``async_execution`` function: the caller makes the RPC.

    A relayed view call runs so: an RPC to the rank itself carried the same outcome through
    TensorPipe and half a dozen thread hand-offs (32 ms a call, median, with 128 ranks on 2
    cores; the direct call costs microseconds)."""
    if not has("rpc_hooks.callee") or getattr(fn, "_wrapped_async_rpc_function", None):
        return NotImplemented
    from torch.distributed.rpc import internal

    result = _run_function(internal.PythonUDF(fn, args, kwargs))
    if isinstance(result, internal.RemoteException):  # as torch's caller re-raises it
        text = result.msg.encode("utf-8").decode("unicode_escape")
        try:
            exc = result.exception_type(text)
        except BaseException as why:  # noqa: BLE001 - torch's words for a type it cannot make
            raise RuntimeError(f"Failed to create original exception type. Error msg was "
                               f"{why} Original exception on remote side was {text}") from why
        raise exc
    return result


def _enter(tid: int, token: object) -> None:
    with _ACTIVE_LOCK_PER_PROCESS:
        _ACTIVE_PER_PROCESS.setdefault(tid, set()).add(token)


def _leave(tid: int, token: object) -> None:
    """Forget ``token`` (idempotent); when ``tid`` runs no other RPC function, drop any
    interrupt injected into it that has not been raised yet."""
    with _ACTIVE_LOCK_PER_PROCESS:
        calls = _ACTIVE_PER_PROCESS.get(tid)
        if calls is not None:
            calls.discard(token)
            if not calls:
                del _ACTIVE_PER_PROCESS[tid]
        # no call into CPython unless one was injected
        if tid in _HIT_PER_PROCESS and tid not in _ACTIVE_PER_PROCESS:
            _HIT_PER_PROCESS.discard(tid)
            clear_pending(tid)


def _call_after_call() -> None:
    """Run the ``after_call`` hook; its failure must not replace the function's outcome."""
    hook = hooks().after_call
    if hook is None:
        return
    try:
        hook()
    except BaseException:  # noqa: BLE001 - reported, never raised into torch's reply path
        try:
            sys.__stderr__.write("nbdist: flushing output after an RPC failed:\n"
                                 + traceback.format_exc())
        except Exception:
            pass


def _remote_exception(exc: BaseException) -> Any:
    """What torch's ``_run_function`` returns for a failure: a RemoteException naming us."""
    from torch._C._distributed_rpc import _get_current_rpc_agent
    from torch.distributed.rpc import internal

    tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # not _run_function's frame
    hook = hooks().on_failure
    if hook is not None:
        try:
            hook(exc, tb)
        except Exception:  # noqa: BLE001 - bookkeeping must not change the reply
            pass
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    where = _get_current_rpc_agent().get_worker_info()
    message = f"On {where}:\n{exc!r}\n{text}"
    if _redirected(sys.stderr):  # the user reads this rank's stderr itself: torch writes there
        print(message, file=sys.stderr)
    return internal.RemoteException(message, type(exc))


def _redirected(stream: Any) -> bool:
    """Whether user code replaced this process's stderr (``redirect_stderr``, a captured
    stream), rather than it being the one the notebook shows (the kernel's, a worker's)."""
    return stream is not sys.__stderr__ and type(stream).__name__ not in _SHOWN_STREAMS


# the classes of the streams whose text reaches the notebook: ipykernel's, a worker's
_SHOWN_STREAMS = frozenset({"OutStream", "ChannelStream"})


def interrupt_rpc_threads() -> int:
    """Raise KeyboardInterrupt in every thread now running an RPC function; returns how many."""
    # held while injecting: a thread cannot leave _ACTIVE_PER_PROCESS meanwhile
    with _ACTIVE_LOCK_PER_PROCESS:
        for tid in _ACTIVE_PER_PROCESS:
            _HIT_PER_PROCESS.add(tid)
            raise_in(tid, KeyboardInterrupt)
        return len(_ACTIVE_PER_PROCESS)


def reset_world_state(init_count: int = 0, keep_init_counter: bool = False) -> None:
    """Forget the per-process RPC counters so this process can join a fresh world;
    ``init_count`` names the next ``init_rpc``'s keys (every member must give the same;
    ``keep_init_counter``: leave it as it is)."""
    if not torch_private.usable("restart"):
        return  # said at %load_ext: a second world in this process hangs
    import torch.distributed.rpc as rpc
    from torch.distributed.rpc import api

    with rpc._init_counter_lock:
        if not keep_init_counter:
            rpc._init_counter = init_count
        # the last init_rpc's rendezvous, kept by torch so its tcp:// store keeps serving:
        # the next one (same address) must not meet there
        vars(rpc).pop("rendezvous_iterator", None)
    release_gathers()  # a gather of the world left can never complete
    with api._all_gather_dict_lock:
        api._all_gather_sequence_id.clear()
        api._all_gather_sequence_id_to_states = collections.defaultdict(
            api._all_gather_sequence_id_to_states.default_factory)


def release_gathers() -> int:
    """Wake every thread of this process waiting in torch's ``_all_gather`` (as its leader,
    for the peers' objects); returns how many gathers were pending.

    ``init_rpc`` ends with one such gather, whose leader waits the whole RPC timeout for
    peers that died: rank 0's join of a failed start or heal then outlived the world by a
    minute and held up the next start (issue 45, seeds 0 and 6). Woken, the leader sends to
    the peers, which fails at once for the dead ones, and the call ends with torch's error.
    Only for a world being left: no gather of a live world may be pending."""
    if not torch_private.usable("restart"):
        return 0
    from torch.distributed.rpc import api

    with api._all_gather_dict_lock:
        states = list(api._all_gather_sequence_id_to_states.values())
    for state in states:
        state.proceed_signal.set()
    return len(states)
