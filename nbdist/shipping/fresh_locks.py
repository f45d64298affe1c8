"""Locks, events, queues and their kin reach another rank as fresh objects of the same kind.

A lock in a notebook global cannot be pickled, and sharing one between processes would mean
nothing anyway: in a script run by every process, each process makes its own. So when notebook
code travels to a rank, every such object it reaches (a global, a class attribute, an instance
attribute) arrives as a new one: unlocked, unset, empty, with the same kind and size
(a ``Semaphore`` keeps its count, a ``Queue`` its ``maxsize``, a ``Barrier`` its parties).
An object of one of these kinds passed *directly* as an RPC argument is still refused
(``shipping`` decides that): there the caller meant to send that very object.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.queues
import multiprocessing.synchronize as mps
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["fresh_reduce", "is_fresh_kind"]


def _semaphore_value(sem: Any) -> int:
    return getattr(sem, "_initial_value", None) or getattr(sem, "_value", 1)


def _mp_semaphore_value(sem: Any) -> int:
    try:
        return max(sem.get_value(), 0)
    except NotImplementedError:  # macOS has no sem_getvalue
        return 1


_REDUCERS: dict[type, Callable[[Any], tuple]] = {
    type(threading.Lock()): lambda o: (threading.Lock, ()),
    type(threading.RLock()): lambda o: (threading.RLock, ()),
    threading.Condition: lambda o: (threading.Condition, (o._lock,)),
    threading.Event: lambda o: (threading.Event, ()),
    threading.Semaphore: lambda o: (threading.Semaphore, (_semaphore_value(o),)),
    threading.BoundedSemaphore: lambda o: (threading.BoundedSemaphore, (_semaphore_value(o),)),
    threading.Barrier: lambda o: (threading.Barrier, (o.parties, o._action, o._timeout)),
    queue.Queue: lambda o: (queue.Queue, (o.maxsize,)),
    queue.LifoQueue: lambda o: (queue.LifoQueue, (o.maxsize,)),
    queue.PriorityQueue: lambda o: (queue.PriorityQueue, (o.maxsize,)),
    queue.SimpleQueue: lambda o: (queue.SimpleQueue, ()),
    mps.Lock: lambda o: (multiprocessing.Lock, ()),
    mps.RLock: lambda o: (multiprocessing.RLock, ()),
    mps.Event: lambda o: (multiprocessing.Event, ()),
    mps.Condition: lambda o: (multiprocessing.Condition, ()),
    mps.Semaphore: lambda o: (multiprocessing.Semaphore, (_mp_semaphore_value(o),)),
    mps.BoundedSemaphore: lambda o: (multiprocessing.BoundedSemaphore,
                                     (_mp_semaphore_value(o),)),
    mps.Barrier: lambda o: (multiprocessing.Barrier, (o.parties,)),
    multiprocessing.queues.Queue: lambda o: (multiprocessing.Queue, (o._maxsize,)),
    multiprocessing.queues.JoinableQueue: lambda o: (multiprocessing.JoinableQueue,
                                                     (o._maxsize,)),
    multiprocessing.queues.SimpleQueue: lambda o: (multiprocessing.SimpleQueue, ()),
}


def is_fresh_kind(t: type) -> bool:
    """Whether objects of exactly this type travel as fresh ones."""
    return t in _REDUCERS


def fresh_reduce(obj: Any) -> tuple:
    """The pickle reduction that makes a new object of ``obj``'s kind on arrival."""
    return _REDUCERS[type(obj)](obj)
