"""The one door to schedulers: the rest of nbdist imports schedulers only from here.

A scheduler is a module implementing ``scheduler_api``: ``hosts.slurm`` (``--slurm``,
``--hosts slurm``, ``--launcher srun``) and ``hosts.ray_placement`` (``--ray``, imported only
when asked for: it imports Ray). This module names the one for the options a user gives;
another scheduler is another module and a line in each function below.
"""

from __future__ import annotations

from . import slurm
from .scheduler_api import Allocation, JobState, NodeShare

__all__ = ["STEP_LAUNCHERS", "Allocation", "JobState", "NodeShare", "enclosing_hosts",
           "new_allocation"]

#: ``--launcher`` names that start a join agent as a step of the allocation the notebook runs in
STEP_LAUNCHERS = {"srun": slurm.STEP_LAUNCHER}


def new_allocation(kind: str, options: str) -> Allocation:
    """An allocation not yet requested from scheduler ``kind`` (``slurm``, ``ray``), for
    ``options`` (the user's own)."""
    if kind == "ray":
        from . import ray_placement

        return ray_placement.RayPlacement(options)
    return slurm.SlurmJob(options)


def enclosing_hosts(name: str) -> tuple[list[str], str] | None:
    """The nodes of the allocation the notebook runs in, when ``name`` names a scheduler
    (``slurm``), with the tasks per node as the scheduler gives them; None otherwise."""
    return slurm.enclosing_hosts(name)
