"""Notebook 11 (issue 27: the DDP tutorial pasted as published) runs headless in quick mode:
its launcher (``setup`` with port 12355, ``cleanup``, ``run_demo`` via ``mp.spawn``) unchanged,
every demo on every rank, and its checks cell asserts equal weights on every rank and an exact
checkpoint round trip."""

from __future__ import annotations

import pytest
from conftest import assert_follows_rules, run_checked

NAME = "11_ddp_tutorial.ipynb"


def test_notebook_11_follows_the_rules():
    assert_follows_rules(NAME, forbidden=("torchrun", "%dist_start", "%%dist"))


@pytest.mark.timeout(300)
def test_notebook_11_ddp_tutorial_quick(tmp_path):
    nb, text, seconds = run_checked(NAME, cwd=tmp_path)
    assert "mp.spawn(demo_basic, nprocs=4) started a world of 4 ranks" in text, text[-3000:]
    for rank in range(4):
        who = f"[worker{rank}] " if rank else ""
        assert f"{who}Running basic DDP example on rank {rank}." in text, text[-3000:]
        assert f"{who}Running DDP checkpoint example on rank {rank}." in text
        assert f"{who}rank {rank}: weights equal on all 4 ranks: True" in text
        assert f"{who}rank {rank}: checkpoint round trip exact: True" in text
    for rank in range(2):
        who = f"[worker{rank}] " if rank else ""
        assert f"{who}Running DDP with model parallel example on rank {rank}." in text
    assert "keep-restarted it to 2 ranks" in text and "keep-restarted it to 4 ranks" in text
