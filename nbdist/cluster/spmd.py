"""``%%dist --local``: the same cell on the workers and in the notebook, at the same time.

SPMD code (DDP, collectives) needs every rank, rank 0 included, to enter the same calls
together. The workers get the cell first, then the notebook runs it through IPython as an
ordinary cell, then the workers' results are collected.
"""

from __future__ import annotations

from typing import Any

__all__ = ["run_with_local"]

# How long workers may still take after the notebook's part of the cell failed: they are
# probably blocked in a collective rank 0 never joined, so they are interrupted after this.
AFTER_LOCAL_FAILURE = 5.0


def run_with_local(cluster: Any, shell: Any, cell: str, targets: list[int],
                   timeout: float | None) -> dict:
    """Run ``cell`` on ``targets`` and in ``shell``; raise if any rank failed."""
    exec_id = cluster.send_cell(cell, targets)
    try:
        outcome = shell.run_cell(cell, store_history=False)
    except KeyboardInterrupt:
        cluster.interrupt(targets)
        cluster.collect(exec_id, targets, 0.5)
        raise
    failed_here = outcome is not None and not outcome.success
    wait = AFTER_LOCAL_FAILURE if failed_here and timeout is None else timeout
    try:
        results = cluster.collect(exec_id, targets, wait)
    except TimeoutError:
        if failed_here:
            print("nbdist: the workers were interrupted because the notebook's part of the cell "
                  "failed (see above)")
            return {}
        raise
    return cluster.report(results, targets)
