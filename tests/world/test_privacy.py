"""Behaviour 7: a local world listens on loopback only, and its files are private."""

from __future__ import annotations

import ipaddress
import os
import stat
import time

import pytest
from conftest import listening

from nbdist.cluster.session import session

cl = session()


def test_only_loopback_listeners_and_private_files(world):
    c = world(2, process_group="gloo")
    pids = [os.getpid(), *c.worker_pids(), cl.template.pid]
    listeners = listening(pids)
    assert listeners, "expected TensorPipe/Gloo listeners"
    for pid, ip, port in listeners:
        assert ipaddress.ip_address(ip).is_loopback, f"pid {pid} listens on {ip}:{port}"
    runtime = cl.runtime_dir
    assert stat.S_IMODE(os.stat(os.path.dirname(runtime)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(runtime).st_mode) == 0o700
    sock = c._world.listener.path
    assert sock.startswith(runtime) and not os.path.exists(sock)  # closed once all were in
    logs = c.router.log_dir
    assert logs.startswith(runtime) and stat.S_IMODE(os.stat(logs).st_mode) == 0o700


def test_the_control_socket_is_private_while_it_listens(tmp_path):
    from nbdist.control.channel import Listener

    listener = Listener(str(tmp_path / "ctl"), os.urandom(32))
    try:
        assert stat.S_IMODE(os.stat(listener.path).st_mode) == 0o600
    finally:
        listener.close()


def test_control_socket_is_gone_once_every_rank_is_in(world):
    """After start-up nothing listens for control connections: a process without the key
    (or with it) cannot even connect; strays during start-up are refused at the handshake
    (tests/world/test_protocol.py). The world keeps working."""
    from nbdist.control.channel import connect

    c = world(1)
    path = c._world.listener.path
    assert not os.path.exists(path)
    t0 = time.monotonic()
    with pytest.raises((FileNotFoundError, ConnectionRefusedError)):
        connect(path, b"wrong key", timeout=0.5).close()
    assert time.monotonic() - t0 < 5
    assert c.run("'still fine'", show=False) == {1: "'still fine'"}
