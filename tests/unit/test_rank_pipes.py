"""A join agent's relay (``hosts.rank_pipes``) over real socketpairs: a ``Relay`` frame reaches
each rank named, and what the ranks send back is batched in order, equal lines once, a cell's
results and a view call's answers waiting for the host's other ranks (but not an error)."""

from __future__ import annotations

import os
import socket
import time

import pytest
from conftest import wait_until

from nbdist.control.channel import Channel
from nbdist.control.protocol import (
    Call,
    Exec,
    Output,
    Relay,
    Relayed,
    Result,
    Returned,
    decode,
    encode,
)
from nbdist.hosts.rank_pipes import HOLD, WINDOW, RankPipes


class Bed:
    """An agent's ``RankPipes`` with ranks whose ends are ordinary channels (no fork: the
    child's end is a duplicate kept here) and the notebook's end of the agent's link."""

    def __init__(self, ranks: list[int]) -> None:
        self.pipes = RankPipes()
        self.ranks: dict[int, Channel] = {}
        for r in ranks:
            fd = self.pipes.before_fork()
            self.ranks[r] = Channel(socket.socket(fileno=os.dup(fd)), name=f"rank {r}")
            self.pipes.forked(r, pid=1000 + r)
        agent_end, notebook_end = socket.socketpair()
        self.agent = Channel(agent_end, threaded=False, name="notebook")
        self.notebook = Channel(notebook_end, name="agent")

    def pump(self, seconds: float) -> None:
        """The agent's loop for a while: read the pipes, send what is due."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for fd in self.pipes.fds():
                if Channel.poll(self._pipe(fd), 0):
                    self.pipes.read(fd)
            self.pipes.flush(self.agent)
            time.sleep(0.002)

    def take(self, rank: int) -> None:
        """Read rank's next frame into the batch (waiting for it), sending nothing."""
        pipe = self.pipes._chan[1000 + rank]
        wait_until(lambda: pipe.poll(0), 2.0, f"rank {rank}'s frame on its pipe")
        self.pipes.read(pipe.fileno())

    def _pipe(self, fd: int) -> Channel:
        return self.pipes._chan[self.pipes._by_fd[fd]]

    def batches(self) -> list[list[tuple[tuple, object]]]:
        got = []
        while self.notebook.poll(0.05):
            msg = self.notebook.recv()
            assert isinstance(msg, Relayed)
            got.append([(ranks, decode(p)) for ranks, p in msg.entries])
        return got

    def close(self) -> None:
        for chan in self.ranks.values():
            chan.close(timeout=0)
        self.agent.close(timeout=0)
        self.notebook.close(timeout=0)
        for pid in list(self.pipes._chan):
            self.pipes._close(pid)


@pytest.fixture
def bed():
    made: list[Bed] = []
    yield lambda ranks: made.append(Bed(ranks)) or made[-1]
    for b in made:
        b.close()


def test_a_relayed_frame_reaches_each_rank_it_names(bed):
    b = bed([2, 3, 4])
    b.pipes.forward(Relay((2, 4), encode(Exec(7, "1 + 1", "<cell>"))))
    for r in (2, 4):
        assert b.ranks[r].recv(timeout=2) == Exec(7, "1 + 1", "<cell>")
    assert not b.ranks[3].poll(0.1)


def test_equal_lines_of_several_ranks_come_once_and_each_ranks_order_is_kept(bed):
    b = bed([2, 3, 4])
    for r, text in ((2, "A\n"), (3, "B\n"), (3, "A\n"), (4, "A\n"), (2, "C\n")):
        b.ranks[r].send(Output(r, "stdout", text))
        b.take(r)  # in this order, whatever the machine's load
    b.pipes.flush(b.agent, force=True)
    entries = [e for batch in b.batches() for e in batch]
    # rank 3's A cannot join rank 2's (its B came after: its own order is kept); rank 4's
    # joins the latest equal line
    assert [(ranks, m.text) for ranks, m in entries] == [((2,), "A\n"), ((3,), "B\n"),
                                                          ((3, 4), "A\n"), ((2,), "C\n")]
    assert entries[2][1].rank == 3  # the frame names the first of its ranks


def test_a_cells_results_wait_for_the_hosts_other_ranks(bed):
    b = bed([2, 3])
    b.pipes.forward(Relay((2, 3), encode(Exec(9, "x", "<cell>"))))
    b.ranks[2].send(Result(2, 9, "ok", "1"))
    b.pump(WINDOW * 3)
    assert b.batches() == []  # held for rank 3 (up to HOLD)
    b.ranks[3].send(Result(3, 9, "ok", "2"))
    b.take(3)
    assert b.pipes.due_in(time.monotonic()) == 0.0  # all answered: no window added
    b.pump(WINDOW * 3)
    batches = b.batches()
    assert len(batches) == 1
    assert [(ranks, m.rank) for ranks, m in batches[0]] == [((2,), 2), ((3,), 3)]


def test_a_view_calls_answers_wait_for_the_hosts_other_ranks_and_go_as_one_frame(bed):
    b = bed([2, 3, 4])
    b.pipes.forward(Relay((2, 3, 4), encode(Call(11, b"fn", 5.0))))
    for r in (2, 3):
        b.ranks[r].send(Returned(r, 11, "ok", b"v"))
        b.take(r)
    assert b.pipes.due_in(time.monotonic()) > WINDOW  # held for rank 4, past the window
    b.ranks[4].send(Returned(4, 11, "ok", b"v"))
    b.take(4)
    assert b.pipes.due_in(time.monotonic()) == 0.0  # all three answered: it goes now
    b.pipes.flush(b.agent)
    batches = b.batches()
    assert [[(ranks, m.call_id) for ranks, m in batch] for batch in batches] == \
        [[((2,), 11), ((3,), 11), ((4,), 11)]]
    assert b.pipes.sent == 1


def test_an_error_is_not_held_and_a_silent_rank_is_waited_for_only_so_long(bed):
    b = bed([2, 3, 4])
    b.pipes.forward(Relay((2, 3, 4), encode(Exec(5, "x", "<cell>"))))
    b.ranks[2].send(Result(2, 5, "error", None, "ValueError", "bad", "tb"))
    b.pump(WINDOW * 3)
    assert [m.status for _, m in b.batches()[0]] == ["error"]
    b.ranks[3].send(Result(3, 5, "ok", "1"))
    t0 = time.monotonic()
    wait_until(lambda: b.pump(0.01) or b.notebook.poll(0), 10.0,
               "rank 3's result, sent although rank 4 never answers")
    assert time.monotonic() - t0 > HOLD * 0.9  # held for rank 4, but not for ever


def test_what_an_exited_rank_sent_last_goes_before_its_exit(bed):
    b = bed([2])
    b.ranks[2].send(Output(2, "stderr", "last words\n"))
    b.ranks[2].drain(2)
    b.pipes.exited(1002, b.agent)
    assert [m.text for _, m in b.batches()[0]] == ["last words\n"]
    assert b.pipes.fds() == []
