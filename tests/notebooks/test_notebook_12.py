"""Notebook 12 (nodes from SLURM, issue 28) runs headless against the SLURM test bed: the
notebook asks for 2 nodes, runs a cell and notebook code on every rank, restarts in the same
job, and its kernel's end gives the allocation back. Skipped, with the reason, where the test
bed cannot start."""

from __future__ import annotations

import pytest
from conftest import assert_follows_rules, run_checked, wait_until
from slurmbed import SlurmBed, cannot_run, jobs

NAME = "12_slurm.ipynb"


def test_notebook_12_follows_the_rules():
    assert_follows_rules(NAME, forbidden=("salloc", "srun "))


@pytest.mark.slurm
@pytest.mark.skipif(cannot_run() is not None, reason=str(cannot_run()))
@pytest.mark.timeout(300)
def test_notebook_12_slurm_quick(tmp_path):
    bed = SlurmBed(nodes=2, task="task/affinity", gpus=0)
    try:
        bed.up()
        nb, text, seconds = run_checked(NAME, cwd=tmp_path)
        assert "RUNNING on nbnode1, nbnode2" in text, text[-3000:]
        assert "LOCAL_RANK 1 threads 1 CPUs [1]" in text, text[-3000:]
        wait_until(lambda: not jobs(), 20.0, "the kernel's end to give the allocation back")
    finally:
        bed.down()
