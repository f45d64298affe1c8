"""The receiver hands a rank's results and flush answers to the callbacks it was given (the
world's cells, from above), tested over a socketpair without a world."""

from __future__ import annotations

import socket
import threading

from conftest import wait_until

from nbdist.comms.relay import CommRelay
from nbdist.control.channel import Channel
from nbdist.control.protocol import Flushed, Result
from nbdist.debugging.prompts import DebugDesk
from nbdist.output.receiver import Receiver
from nbdist.output.rich_output import RichOutput
from nbdist.output.router import Router
from nbdist.rank_info import RankInfo


def test_results_and_flushes_reach_the_callbacks():
    ours, theirs = socket.socketpair()
    notebook, worker = Channel(ours, name="worker1"), Channel(theirs, name="notebook")
    ranks = {1: RankInfo(1, "worker1", pid=1, channel=notebook)}
    results, flushed = [], []
    router = Router(workers=lambda: [1])
    receiver = Receiver(ranks, router, RichOutput(ranks), DebugDesk(ranks, lambda r, m: True),
                        CommRelay(lambda r, m: True), threading.Condition(),
                        on_result=results.append,
                        on_flushed=lambda rank, token: flushed.append((rank, token)),
                        on_returned=lambda returned: None)
    receiver.start()
    try:
        worker.send(Result(1, 7, "ok", "42"))
        worker.send(Flushed(1, 3))
        wait_until(lambda: results and flushed, 10.0, "the receiver's callbacks")
        assert [(r.rank, r.exec_id, r.value) for r in results] == [(1, 7, "42")]
        assert flushed == [(1, 3)]
    finally:
        worker.close()
        notebook.close()
        receiver.stop()
        router.close()
