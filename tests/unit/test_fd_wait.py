"""``fd_wait.readable``: poll() where select() refused descriptors numbered 1024 or more,
failing on a closed descriptor as select() did."""

from __future__ import annotations

import os
import resource
import select
import socket
import time

import pytest

from nbdist.control.channel import Channel
from nbdist.control.protocol import Output
from nbdist.fd_wait import readable

HIGH = 1500


@pytest.fixture()
def high_pair():
    """A socket pair whose one end is descriptor ``HIGH``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= HIGH:
        pytest.skip(f"the hard limit on open files ({hard}) is below {HIGH}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HIGH + 1), hard))
    a, b = socket.socketpair()
    os.dup2(a.fileno(), HIGH)
    a.close()
    high = socket.socket(fileno=HIGH)
    try:
        yield high, b
    finally:
        high.close()
        b.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_select_refuses_what_readable_waits_on(high_pair):
    high, other = high_pair
    with pytest.raises(ValueError, match="out of range"):
        select.select([high.fileno()], [], [], 0)
    t0 = time.monotonic()
    assert readable([high.fileno()], 0.05) == []
    assert time.monotonic() - t0 >= 0.04
    other.send(b"x")
    assert readable([high.fileno(), other.fileno()], 1.0) == [high.fileno()]


def test_a_channel_numbered_past_1024_polls_and_receives(high_pair):
    high, other = high_pair
    rx, tx = Channel(high, threaded=False, name="high"), Channel(other, threaded=False,
                                                                 name="low")
    assert not rx.poll(0)
    tx.send(Output(1, "stdout", "hello\n"))
    assert rx.poll(1.0)
    assert rx.recv(timeout=1.0) == Output(1, "stdout", "hello\n")


def test_an_end_is_readable_and_a_closed_descriptor_fails_as_with_select():
    a, b = socket.socketpair()
    b.close()
    assert readable([a.fileno()], 1.0) == [a.fileno()]  # EOF: the reader finds out
    fd = a.fileno()
    a.close()
    with pytest.raises(OSError):
        readable([fd], 0)
    with pytest.raises(ValueError):
        readable([-1], 0)


def test_a_timeout_of_days_waits_as_select_did():
    """torch hands a store's waits timeouts of days (a Gloo group's 30 minutes plus
    nbdist's margins, or ``timedelta.max`` where none was given): poll() takes a C int of
    milliseconds, so a longer one is the longest it takes, not an OverflowError."""
    a, b = socket.socketpair()
    try:
        b.send(b"x")
        assert readable([a.fileno()], 1e12) == [a.fileno()]
        assert readable([a.fileno()], float(2**40)) == [a.fileno()]
    finally:
        a.close()
        b.close()
