"""Behaviour 7: a local world listens on loopback only, and its files are private."""

from __future__ import annotations

import ipaddress
import os
import stat

import psutil

from nbdist.cluster.session import SESSION as cl


def _listening(pids: list[int]) -> list:
    found = []
    for pid in pids:
        for conn in psutil.Process(pid).net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN:
                found.append((pid, conn.laddr.ip, conn.laddr.port))
    return found


def test_only_loopback_listeners_and_private_files(world):
    c = world(2, process_group="gloo")
    pids = [os.getpid(), *c.worker_pids(), cl.template.pid]
    listeners = _listening(pids)
    assert listeners, "expected TensorPipe/Gloo listeners"
    for pid, ip, port in listeners:
        assert ipaddress.ip_address(ip).is_loopback, f"pid {pid} listens on {ip}:{port}"
    runtime = cl.runtime_dir
    assert stat.S_IMODE(os.stat(os.path.dirname(runtime)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(runtime).st_mode) == 0o700
    sock = c._listener.path
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    assert sock.startswith(runtime)


def test_control_socket_rejects_a_process_without_the_key(world):
    import pytest

    from nbdist.proc.channel import connect

    c = world(1)
    with pytest.raises((ConnectionError, EOFError, OSError)):
        chan = connect(c._listener.path, b"wrong key", timeout=2)
        chan.send(("hello", 1, os.getpid()))
        chan.recv()
    assert c.run("'still fine'", show=False) == {1: "'still fine'"}
