"""``%%dist --local``: the same cell on the workers and in the notebook, at the same time.

SPMD code (DDP, collectives) needs every rank, rank 0 included, to enter the same calls
together. The workers get the cell first, then the notebook runs it through IPython as an
ordinary cell, then the workers' results are collected.

Fail fast (the default): the first rank to fail, by raising or by dying, ends the cell on
every rank at once (``failfast``), and the cell shows that failure first. With
``fail_fast=False`` the workers run on until they finish, or for ``AFTER_LOCAL_FAILURE``
seconds after the notebook's part failed.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from ..errors import DistCellError, DistTimeoutError, RankFailure, ranks_named
from ..rank_sets import labels
from .failfast import FailFast

__all__ = ["run_with_local"]

# How long workers may still take after the notebook's part of the cell failed (fail_fast
# off): they are probably blocked in a collective rank 0 never joined, so they are
# interrupted after this.
AFTER_LOCAL_FAILURE = 5.0
# With fail_fast: how long the interrupted ranks have to report
AFTER_INTERRUPT = 1.0


def run_with_local(cluster: Any, shell: Any, cell: str, targets: list[int],
                   timeout: float | None, fail_fast: bool = True) -> dict:
    """Run ``cell`` on ``targets`` and in ``shell``; raise if any rank failed."""
    exec_id = cluster.send_cell(cell, targets)
    watch = FailFast(cluster, exec_id, targets, shell) if fail_fast else None
    outcome = None
    shell.nbdist_local_exec_id = exec_id  # rank 0 runs the cell the workers run by this id
    try:
        with watch.rank0() if watch is not None else contextlib.nullcontext():
            outcome = shell.run_cell(cell, store_history=False)
    except KeyboardInterrupt:
        if watch is None or watch.first is None:  # the user's Ctrl-C
            cluster.interrupt(targets)
            cluster.collect(exec_id, targets, 0.5)
            raise
    finally:
        shell.nbdist_local_exec_id = None
    failed_here = outcome is None or not outcome.success
    interrupted = fail_fast and (failed_here or watch is not None and watch.first is not None)
    if watch is not None and watch.first is not None:
        watch.say_why()
    elif interrupted:  # rank 0 failed first
        cluster.cells.interrupt(cluster.cells.pending(exec_id, targets))
    here = _failed_here(cluster, outcome) if failed_here else []
    if not interrupted:
        wait = AFTER_LOCAL_FAILURE if failed_here and timeout is None else timeout
        try:
            results = cluster.collect(exec_id, targets, wait)
        except DistTimeoutError:
            if failed_here:
                print("nbdist: the workers were interrupted because the notebook's part of "
                      "the cell failed (see above)")
                raise _cell_error(here) from None
            raise
        return _report(cluster, results, targets, here)
    results = cluster.collect(exec_id, targets, AFTER_INTERRUPT, partial=True)
    stuck = [r for r in targets if r not in results]
    if stuck:
        names = labels((r, cluster.names[r]) for r in stuck)
        print(f"nbdist: {names} did not stop within {AFTER_INTERRUPT:g}s of the interrupt "
              "(inside a collective?); the cell ends without waiting", file=sys.stderr)
    first = watch.first if watch is not None else None
    return _report(cluster, results, [r for r in targets if r in results and (
        r == first or not _interrupted_by_us(results[r]))], here if first is None else [])


def _failed_here(cluster: Any, outcome: Any) -> list[RankFailure]:
    """The notebook's part as a failure of rank 0 (IPython showed its traceback already)."""
    err = None if outcome is None else outcome.error_in_exec or outcome.error_before_exec
    return [RankFailure(0, cluster.names[0], type(err).__name__ if err else "Error",
                        str(err) if err else "its part of the cell failed",
                        "(its traceback is shown above)\n")]


def _cell_error(failures: list[RankFailure]) -> DistCellError:
    return DistCellError(failures, f"the cell failed on {ranks_named(failures)}: ")


def _report(cluster: Any, results: dict, targets: list[int],
            here: list[RankFailure]) -> dict:
    """``cluster.report``, rank 0's failure (``here``) first among the ranks that failed."""
    try:
        values = cluster.report(results, targets)
    except DistCellError as exc:
        if here:
            raise _cell_error(here + exc.failures) from None
        raise
    if here:
        raise _cell_error(here)
    return values


def _interrupted_by_us(result: Any) -> bool:
    """A worker's part that ended by the interrupt fail-fast sent (a consequence, not shown)."""
    return result is not None and result.error_type == "KeyboardInterrupt"
