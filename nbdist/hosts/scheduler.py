"""The one door to batch schedulers: the rest of nbdist imports schedulers only from here.

A scheduler is a module implementing ``scheduler_api`` (``hosts.slurm`` so far); this module
names it for the options a user gives (``--slurm``, ``--hosts slurm``, ``--launcher srun``).
Another scheduler is another module and a line in each function below.
"""

from __future__ import annotations

from . import slurm
from .scheduler_api import Allocation, JobState, NodeShare

__all__ = ["STEP_LAUNCHERS", "Allocation", "JobState", "NodeShare", "describe_end",
           "enclosing_hosts", "new_allocation"]

#: ``--launcher`` names that start a join agent as a step of the allocation the notebook runs in
STEP_LAUNCHERS = {"srun": slurm.STEP_LAUNCHER}


def new_allocation(options: str) -> Allocation:
    """An allocation not yet requested, for ``--slurm`` ``options`` (the user's own)."""
    return slurm.SlurmJob(options)


def describe_end(state: JobState) -> str:
    """Why a job ended, in the scheduler's words and ours."""
    return slurm.describe_end(state)


def enclosing_hosts(name: str) -> tuple[list[str], str] | None:
    """The nodes of the allocation the notebook runs in, when ``name`` names a scheduler
    (``slurm``), with the tasks per node as the scheduler gives them; None otherwise."""
    return slurm.enclosing_hosts(name)
