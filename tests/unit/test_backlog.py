"""``backlog.Widener`` gives this process's TCP listeners a long accept queue in place: a
listener opened with a backlog of 1 then holds 64 connections nobody accepted yet (the kernel
would drop the SYNs of all but the first two), while unix and connected sockets, and listeners
already widened, are left alone."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

import pytest

from nbdist.proc.backlog import BACKLOG, RECHECK_EVERY, Widener


def _queued(port: int, n: int) -> int:
    """How many of ``n`` connections to ``port`` complete within 0.5 s each, unaccepted."""
    done, conns = 0, []
    try:
        for _ in range(n):
            c = socket.socket()
            c.settimeout(0.5)
            conns.append(c)
            try:
                c.connect(("127.0.0.1", port))
                c.send(b"x")
                done += 1
            except OSError:
                pass
    finally:
        for c in conns:
            c.close()
    return done


def test_a_listener_opened_with_a_short_queue_is_widened_in_place():
    widener = Widener()
    widener.scan()  # what was open before
    other, _ = socket.socketpair()  # a unix socket: not a listener to widen
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        assert widener.scan() == 1 and widener.widened == [port]
        assert widener.scan() == 0  # each once
        if shutil.which("ss"):  # the kernel's own view of the queue
            ss = subprocess.run(["ss", "-ltn", f"sport = :{port}"], capture_output=True,
                                text=True, timeout=30).stdout.split()
            assert str(min(BACKLOG, int(open("/proc/sys/net/core/somaxconn").read()))) in ss
        assert _queued(port, 64) == 64
    finally:
        srv.close()
        other.close()


def test_without_it_the_short_queue_refuses_to_hold_them():
    """The check above can fail: unwidened, the same listener completes only a few."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    try:
        got = _queued(srv.getsockname()[1], 8)
    finally:
        srv.close()
    if got == 8:
        pytest.fail("a backlog of 1 held 8 connections: this kernel queues past the backlog")
    assert got < 8


def test_a_descriptor_number_reused_by_a_listener_between_scans_is_widened():
    """A socket closed and its number taken by a new listener between two scans (Gloo's
    pairs come and go while TensorPipe opens its listeners) is found by the recheck."""
    widener = Widener()
    before = socket.socket()  # an unconnected TCP socket: not a listener
    widener.scan()
    number = before.fileno()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    before.close()
    os.dup2(srv.fileno(), number)  # the listener now holds the old number as well
    srv.close()
    srv = socket.socket(fileno=number)  # and only that one
    try:
        found = sum(widener.scan() for _ in range(RECHECK_EVERY))
        assert found == 1 and widener.widened == [port]
        assert widener.scan() == 0
        assert _queued(port, 64) == 64
    finally:
        srv.close()
