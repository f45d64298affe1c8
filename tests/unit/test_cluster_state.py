"""``ClusterState``'s moves: one table (``lifecycle.MOVES``) that every change of a world's
state goes through; a move not in it raises, naming both states."""

from __future__ import annotations

import ast
import threading
from types import SimpleNamespace

import pytest
from conftest import ROOT

from nbdist.cluster.lifecycle import MOVES, ClusterState
from nbdist.cluster.world import World
from nbdist.errors import ClusterStateError
from nbdist.spec import WorldSpec

S = ClusterState
#: The life cycle as docs/guide/when-a-rank-dies.md tells it, written out pair by pair.
LEGAL = {(S.NEW, S.STARTING), (S.STARTING, S.RUNNING),
         (S.RUNNING, S.HEALING), (S.RUNNING, S.RESTARTING), (S.RUNNING, S.GROWING),
         (S.HEALING, S.RUNNING), (S.RESTARTING, S.RUNNING), (S.GROWING, S.RUNNING),
         (S.STOPPING, S.STOPPED)} | {(s, S.STOPPING) for s in S if s not in (S.STOPPING,
                                                                              S.STOPPED)}


def test_the_table_holds_every_state_and_only_the_legal_moves():
    assert set(MOVES) == set(S)
    assert {(a, b) for a, to in MOVES.items() for b in to} == LEGAL


@pytest.mark.parametrize("old,new", sorted(LEGAL, key=str))
def test_a_legal_move_is_made(old, new):
    assert old.moved_to(new) is new


@pytest.mark.parametrize("old,new", sorted({(a, b) for a in S for b in S} - LEGAL, key=str))
def test_an_illegal_move_raises_naming_both_states(old, new):
    with pytest.raises(ClusterStateError, match=f"from {old.value} to {new.value}: "):
        old.moved_to(new)


def test_the_message_says_where_a_state_may_go():
    with pytest.raises(ClusterStateError, match="from starting it goes running or stopping$"):
        S.STARTING.moved_to(S.HEALING)
    with pytest.raises(ClusterStateError, match="from stopped it goes nowhere$"):
        S.STOPPED.moved_to(S.STARTING)


def _world() -> World:
    """A ``World`` of two ranks with nothing started (its parts are stand-ins)."""
    spec = WorldSpec(n=1)
    cells = SimpleNamespace(interrupt_rpc=lambda rank: None)
    return World(spec, spec.names(), {}, threading.Condition(), router=None, cells=cells,
                 receiver=None, epoch=1, on_up=lambda: None, on_down=lambda: None)


def test_a_world_refuses_a_move_the_table_lacks():
    world = _world()
    assert world.state is S.NEW
    with pytest.raises(ClusterStateError, match="from new to running"):
        world._running(0.0)  # running without starting
    with pytest.raises(ClusterStateError, match="from new to healing"):
        world._move(S.HEALING)
    world._move(S.STARTING)
    with pytest.raises(ClusterStateError, match="from starting to restarting"):
        world._move(S.RESTARTING)
    world._move(S.STOPPING)
    world._move(S.STOPPED)
    with pytest.raises(ClusterStateError, match="from stopped to starting"):
        world._move(S.STARTING)
    assert world.state is S.STOPPED
    with pytest.raises(AttributeError):
        world.state = S.RUNNING  # a move is made by _move, not by assignment


def test_only_the_move_changes_a_world_state():
    """In ``cluster/world.py`` the state is set once in ``__init__`` and else by ``_move``."""
    tree = ast.parse((ROOT / "nbdist" / "cluster" / "world.py").read_text())
    setters = []
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
                setters += [fn.name for t in targets if isinstance(t, ast.Attribute)
                            and t.attr in ("state", "_state")]
    assert sorted(setters) == ["__init__", "_move"]
