"""Issue 19, item 2: ``--worker-name`` takes a list of roles (``ps,trainer{rank}``).

The parsing is pure (``nbdist.spec.worker_names``) and tested without processes; one real
world checks that the names are the RPC names the workers answer to.
"""

from __future__ import annotations

import os

import pytest
from IPython.core.error import UsageError

from nbdist.spec import WorldSpec, worker_names


@pytest.mark.parametrize("spec, count, names", [
    ("ps,trainer{rank}", 4, ["ps", "trainer2", "trainer3", "trainer4"]),
    ("ps,trainer{rank}", 1, ["ps"]),                       # the pattern may go unused
    ("ps,eval,w{rank:02d}", 4, ["ps", "eval", "w03", "w04"]),
    (" ps , trainer{rank} ", 2, ["ps", "trainer2"]),       # blanks around entries are dropped
    ("ps,learner", 2, ["ps", "learner"]),                  # one fixed name per worker
    ("obs{rank}", 3, ["obs1", "obs2", "obs3"]),            # the single pattern, as before
    ("ps", 1, ["ps"]),                                     # a fixed name with one worker
])
def test_role_lists_name_every_worker(spec, count, names):
    assert worker_names(spec, count) == names


@pytest.mark.parametrize("spec, count, words", [
    ("ps,ps,trainer{rank}", 3, "names 'ps' twice"),
    ("a,b,c", 2, "3 fixed names but this world has 2 workers"),
    ("a,b,t{rank}", 1, "2 fixed names but this world has 1 worker"),
    ("ps,trainer", 3, "no {rank} entry for rank 3"),
    ("a,b", 4, "no {rank} entry for ranks 3..4"),
    ("agent,trainer{rank}", 2, "the notebook's name 'agent'"),
    ("ps,,trainer{rank}", 3, "empty entry"),
    ("ps,", 2, "empty entry"),
    ("trainer{rank},ps", 3, "only the last entry may be a pattern"),
    ("ps,trainer{x}", 3, "not a valid pattern"),
    ("ps,trainer", 2, None),                                # exactly enough: fine
    ("obs", 2, "has no {rank}"),
])
def test_bad_role_lists_say_what_is_wrong(spec, count, words):
    if words is None:
        assert len(worker_names(spec, count, "agent")) == count
        return
    with pytest.raises(ValueError) as info:
        worker_names(spec, count, "agent")
    assert words in str(info.value), str(info.value)


def test_the_spec_takes_a_list_from_python_and_checks_the_whole_world():
    spec = WorldSpec(3, name="agent", worker_name=["ps", "trainer{rank}"]).validate()
    assert spec.worker_name == "ps,trainer{rank}"
    assert spec.names() == ["agent", "ps", "trainer2", "trainer3"]
    with pytest.raises(ValueError, match="duplicate name 'trainer2'"):
        WorldSpec(2, worker_name="trainer2,trainer{rank}").validate()
    with pytest.raises(ValueError, match="invalid name 'p s'"):
        WorldSpec(2, worker_name="p s,t{rank}").validate()


@pytest.mark.parametrize("line, words", [
    ("3 --worker-name ps,ps,t{rank}", "names 'ps' twice"),
    ("2 --worker-name a,b,c", "3 fixed names"),
    ("2 --name agent --worker-name agent,t{rank}", "the notebook's name"),
    ("2 --worker-name ps,,t{rank}", "empty entry"),
])
def test_the_magic_turns_a_bad_list_into_a_usage_error(ipython, line, words):
    with pytest.raises(UsageError, match="%dist_start: .*" + words.replace("(", r"\(")):
        ipython.run_line_magic("dist_start", line)
    import nbdist

    assert nbdist.current() is None


def _whoami(tag):
    import torch.distributed.rpc as rpc

    return tag, rpc.get_worker_info().name, os.getpid()


def test_a_world_with_roles_answers_rpcs_by_role(ipython):
    import torch.distributed.rpc as rpc

    import nbdist

    ipython.run_line_magic("dist_start", "3 --worker-name ps,trainer{rank}")
    c = nbdist.current()
    assert c.names == ["worker0", "ps", "trainer2", "trainer3"]
    assert rpc.rpc_sync("ps", _whoami, args=("p",))[:2] == ("p", "ps")
    tag, name, pid = rpc.rpc_sync("trainer2", _whoami, args=("t",))
    assert (tag, name) == ("t", "trainer2") and pid != os.getpid()
    # %%dist selects ranks by role name too
    ipython.run_cell_magic("dist", "--ranks ps,trainer3", "ROLE = 'any'")
    # a restart keeps the list and applies it to the new size
    ipython.run_line_magic("dist_restart", "1")
    assert nbdist.current().names == ["worker0", "ps"]
