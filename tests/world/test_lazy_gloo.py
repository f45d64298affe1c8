"""The Gloo group inside ``init_rpc`` connects only the pairs it uses in a world on one machine
(``nbdist/proc/lazy_gloo.py``): torch's ``TORCH_GLOO_LAZY_INIT`` is set while ``init_rpc``
makes that group and not after, so a group user code makes gets torch's default; a value
the user set is theirs. Rank 0's group is seen as torch makes it (the class torch calls,
wrapped to note the variable); the workers' environment is read after the start."""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist

from nbdist.proc.lazy_gloo import VARIABLE, lazy_connections


@pytest.fixture()
def seen(monkeypatch):
    """The variable's value each time torch makes a ``ProcessGroupGloo`` in this process."""
    made = []
    original = dist.ProcessGroupGloo

    class Noted(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            made.append(os.environ.get(VARIABLE))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(dist, "ProcessGroupGloo", Noted)
    return made


def test_init_rpcs_group_is_lazy_and_nothing_after(world, seen, monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)
    c = world(2)
    assert seen == ["1"]  # rank 0's group inside init_rpc
    assert VARIABLE not in os.environ
    assert c.run(f"import os\nos.environ.get({VARIABLE!r})", show=False) == \
        {1: None, 2: None}  # a cell whose value is None shows none


def test_a_value_the_user_set_is_kept(world, seen, monkeypatch):
    monkeypatch.setenv(VARIABLE, "0")
    c = world(2)
    assert seen == ["0"]
    assert c.run(f"import os\nos.environ.get({VARIABLE!r})", show=False) == \
        {1: "'0'", 2: "'0'"}


def test_lazy_connections_restores_the_environment(monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)
    with lazy_connections():
        assert os.environ[VARIABLE] == "1"
    assert VARIABLE not in os.environ
    with pytest.raises(KeyError), lazy_connections():
        raise KeyError("a failed init_rpc")
    assert VARIABLE not in os.environ
    monkeypatch.setenv(VARIABLE, "0")
    with lazy_connections():
        assert os.environ[VARIABLE] == "0"
    assert os.environ[VARIABLE] == "0"
