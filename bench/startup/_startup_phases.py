"""Bench-only instrumentation: where ``nbdist.start`` and ``Cluster.restart`` spend their time.

``install()`` wraps a few methods of ``nbdist.cluster.core.Cluster`` and
``nbdist.hosts.launch.Template`` (nothing in ``nbdist`` is edited) so that each call appends
``(phase, begin, end)`` in ``time.perf_counter`` seconds to ``EVENTS``.
``breakdown(since)`` turns the events recorded after ``since`` into seconds per phase, in the
order the phases happen:

- ``stop``: the previous world ends (a restart only): ``Cluster.stop``, of which ``stop_rpc``
  is rank 0's ``rpc.shutdown(graceful=False)`` (``Rank0.leave``);
- ``template``: ``Template.ensure_started`` until ``Template.wait_ready`` returns (the warm
  template imports torch; ~0 when it is already warm), plus the notebook's own
  ``import torch.distributed.rpc`` and the control socket;
- ``fork``: ``Template.spawn``, the template forks one worker per rank;
- ``connect``: ``StartWatch.accept_all``, every worker connected to the control socket;
- ``init_rpc``: ``Rank0.join``, rank 0's ``init_rpc``, which returns once every rank has
  joined the rendezvous;
- ``ready``: ``StartWatch.wait_ready``, every worker reported ready (after its own
  ``init_rpc``);
- ``ping``: ``StartWatch.ping_all``, one ``rpc_async`` answered by every worker.

A name here that nbdist no longer has fails ``install()`` at once (``--smoke`` runs it).
"""

from __future__ import annotations

import functools
import time
from typing import Any

__all__ = ["EVENTS", "PHASES", "breakdown", "install"]

EVENTS: list[tuple[str, float, float]] = []

#: Phase names in the order they happen, as ``breakdown`` reports them.
PHASES = ("stop", "stop_rpc", "template", "fork", "connect", "init_rpc", "ready", "ping")

_WRAPPED = {
    ("cluster.core", "Cluster", "stop"): "stop",
    ("cluster.startup", "Rank0", "leave"): "stop_rpc",
    ("cluster.core", "Cluster", "_start"): "start",
    ("hosts.launch", "Template", "spawn"): "fork",
    ("cluster.startup", "StartWatch", "accept_all"): "connect",
    ("cluster.startup", "Rank0", "join"): "init_rpc",
    ("cluster.startup", "StartWatch", "wait_ready"): "ready",
    ("cluster.startup", "StartWatch", "ping_all"): "ping",
}
_installed = False


def _wrap(fn: Any, phase: str) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            EVENTS.append((phase, t0, time.perf_counter()))

    wrapper.__nbdist_bench_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


def install() -> None:
    """Wrap the phase methods (once per process)."""
    global _installed
    if _installed:
        return
    import importlib

    for (mod, cls, meth), phase in _WRAPPED.items():
        klass = getattr(importlib.import_module(f"nbdist.{mod}"), cls)
        setattr(klass, meth, _wrap(getattr(klass, meth), phase))
    _installed = True


def breakdown(since: float) -> dict[str, float]:
    """Seconds per phase for the events that began at or after ``since`` (one start/restart).

    ``template`` is what ``_start`` spent before forking: the rest of ``start`` not covered
    by the later phases is counted there. ``other`` is whatever ``restart`` spent outside
    ``stop`` and ``start`` (validating the spec, building the ``Cluster``).
    """
    ev = [e for e in EVENTS if e[1] >= since]
    out: dict[str, float] = {}
    for phase, t0, t1 in ev:
        out[phase] = out.get(phase, 0.0) + (t1 - t0)
    start = out.pop("start", None)
    if start is not None:
        later = sum(out.get(p, 0.0) for p in ("fork", "connect", "init_rpc", "ready", "ping"))
        out["template"] = max(start - later, 0.0)
    return {p: round(out[p], 4) for p in PHASES if p in out}
