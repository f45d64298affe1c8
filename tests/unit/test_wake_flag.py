"""Interrupts landing while a thread wakes a flusher: the CI failure of stop 56.

A worker's RPC function that prints, hit by nbdist's interrupt inside ``threading.Event.set``,
left the event's lock held: every later print on that rank blocked, and the next cell timed
out. Here a thread sets a flag in a loop while another raises KeyboardInterrupt in it every
0.1 ms (the GIL handed over every microsecond): ``threading.Event`` ends stuck (the control
case, the hazard itself), ``WakeFlag``, a ``ChannelStream``'s write and the metrics outbox's
wake never do, and each still works after. The cases that leave a thread behind (a stuck
one, a stream's flusher) run in a child process of their own.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from nbdist.output.rank_streams import ChannelStream
from nbdist.telemetry import outbox
from nbdist.thread_raise import clear_pending, raise_in
from nbdist.wake_flag import WakeFlag

HAIL_SECONDS = 2.0
EVENT_DEADLINE = 10.0  # the control case: an Event seen stuck within this (3 of 3: < 2 s)


class _Hail:
    """``step()`` called in a loop by a thread of its own while interrupts rain on it."""

    def __init__(self, step: Callable[[], object]) -> None:
        self.step, self.calls, self.stop = step, 0, False
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        # an interrupt can land on the handler's own bytecodes and the loop's back edge, not
        # only inside ``step``: each level survives one that escapes the level inside it
        for _ in range(1000):
            try:
                self._spin()
                return
            except KeyboardInterrupt:
                continue

    def _spin(self) -> None:
        while not self.stop:
            try:
                while not self.stop:
                    self.step()
                    self.calls += 1
            except KeyboardInterrupt:
                pass

    def stuck(self) -> bool:
        """Whether the looping thread made no call for 0.3 s."""
        before = self.calls
        time.sleep(0.3)
        return self.calls == before

    def run(self, seconds: float, until: Callable[[], bool] | None = None) -> int:
        """Interrupt the thread for ``seconds`` (or until ``until()``); how many were raised."""
        self.thread.start()
        switch = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        raised, end, check = 0, time.monotonic() + seconds, time.monotonic() + 0.5
        try:
            while time.monotonic() < end:
                raise_in(self.thread.ident, KeyboardInterrupt)
                raised += 1
                time.sleep(0.0001)
                if until is not None and time.monotonic() > check:
                    if until():
                        break
                    check = time.monotonic() + 0.5
        finally:
            sys.setswitchinterval(switch)
        return raised

    def end(self) -> bool:
        """Stop the loop; True when the thread ended (else it is left stuck, a daemon)."""
        self.stop = True
        self.thread.join(2.0)
        if self.thread.is_alive():
            clear_pending(self.thread.ident)
            return False
        return True


def _event_sticks() -> None:
    event = threading.Event()
    hail = _Hail(event.set)
    hail.run(EVENT_DEADLINE, until=lambda: event._cond._lock.locked() and hail.stuck())
    assert event._cond._lock.locked() and hail.stuck(), \
        f"threading.Event survived {EVENT_DEADLINE:g} s of interrupts in set()"
    hail.end()


def _in_child(case: str) -> None:
    """Run ``case`` of this file in a fresh interpreter; its failure is this test's."""
    done = subprocess.run([sys.executable, str(Path(__file__)), case], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, f"{case} failed in its child:\n{done.stderr[-3000:]}"


def test_an_interrupted_event_set_leaves_its_lock_held_the_hazard_itself() -> None:
    _in_child("event")


def test_wake_flag_set_under_interrupts_never_sticks() -> None:
    flag = WakeFlag()
    hail = _Hail(flag.set)
    raised = hail.run(HAIL_SECONDS)
    assert hail.end(), f"set() stuck after {raised} interrupts"
    assert hail.calls > 0
    flag.clear()
    assert not flag.is_set() and not flag.wait(0.01)
    threading.Timer(0.05, flag.set).start()
    t0 = time.monotonic()
    assert flag.wait(5.0) and time.monotonic() - t0 < 4.0
    assert not flag.is_set(), "wait() takes the flag"


class _Collect:
    """Where the stream's Output messages go: the notebook's end of the channel."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def send(self, msg: object, droppable: bool = False) -> int:
        self.texts.append(msg.text)
        return len(msg.text)


def _stream_keeps_working() -> None:
    sink = _Collect()
    stream = ChannelStream(sink, 1, "stdout")
    hail = _Hail(lambda: stream.write("x"))
    raised = hail.run(HAIL_SECONDS)
    assert hail.end(), f"write() stuck after {raised} interrupts"
    stream.write("the last line\n")  # no flush: the background flusher must send it
    deadline = time.monotonic() + 5.0
    while not any("the last line" in t for t in sink.texts) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert any("the last line" in t for t in sink.texts), \
        "the flusher never sent a write made after the interrupts"


def test_prints_interrupted_anywhere_leave_the_stream_and_its_flusher_working() -> None:
    _in_child("stream")


def test_metrics_wake_interrupted_anywhere_still_wakes() -> None:
    hail = _Hail(outbox.wake)
    raised = hail.run(HAIL_SECONDS)
    assert hail.end(), f"outbox.wake() stuck after {raised} interrupts"
    outbox.wake()
    assert outbox._OUTBOX_PER_PROCESS.woken.wait(1.0)


if __name__ == "__main__":
    {"event": _event_sticks, "stream": _stream_keeps_working}[sys.argv[1]]()
