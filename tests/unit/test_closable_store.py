"""Rank 0's RPC rendezvous in a local world (``proc.store.ClosableStore`` over torch's
``FileStore``): its waits end when it is closed, and torch's own consumers (a Gloo group, as
``init_rpc`` builds one) use it beside plain ``FileStore`` peers."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import torch.distributed as dist

from nbdist.errors import DistTimeoutError
from nbdist.proc.store import ClosableStore


def _store(tmp_path, timeout: float = 30.0) -> ClosableStore:
    return ClosableStore(dist.FileStore(str(tmp_path / "rpc-1"), 2), timeout)


def test_a_key_another_process_sets_is_read(tmp_path):
    store = _store(tmp_path)
    subprocess.run([sys.executable, "-c", "import torch.distributed as d; "
                    f"d.FileStore({str(tmp_path / 'rpc-1')!r}, 2).set('addr', 'uv://x')"],
                   check=True, timeout=120)
    assert store.get("addr") == b"uv://x"
    store.set("mine", "1")
    assert store.check(["mine", "addr"]) and store.add("n", 2) == 2


def test_close_ends_a_wait_at_once(tmp_path):
    store = _store(tmp_path, timeout=60.0)
    box: dict = {}

    def waiter() -> None:
        t0 = time.monotonic()
        try:
            store.get("never")
        except RuntimeError as exc:
            box["error"], box["took"] = exc, time.monotonic() - t0

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.5)
    closed_at = time.monotonic()
    store.close()
    t.join(5)
    assert not t.is_alive(), "a closed store's wait went on"
    assert "closed" in str(box["error"])
    assert time.monotonic() - closed_at < 1.0  # one slice of the inner wait at most


def test_close_ends_a_wait_whose_file_is_gone(tmp_path):
    """A world's teardown removes its directory while rank 0's join may still wait on the
    store: torch's FileStore then keeps reopening the missing file for its own timeout."""
    import shutil

    world = tmp_path / "world"
    world.mkdir()
    store = ClosableStore(dist.FileStore(str(world / "rpc-1"), 2), 60.0)
    box: dict = {}

    def waiter() -> None:
        try:
            store.wait(["never"])
        except RuntimeError as exc:
            box["error"] = exc

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.5)
    shutil.rmtree(world)
    time.sleep(0.5)
    closed_at = time.monotonic()
    store.close()
    t.join(10)
    assert not t.is_alive() and "closed" in str(box["error"]), box
    assert time.monotonic() - closed_at < 3.0


def test_a_wait_ends_at_its_timeout(tmp_path):
    store = _store(tmp_path, timeout=0.6)
    t0 = time.monotonic()
    with pytest.raises(DistTimeoutError, match="never"):
        store.get("never")
    assert 0.5 < time.monotonic() - t0 < 3.0


GLOO_PEER = """
import sys, torch, torch.distributed as dist
store = dist.FileStore(sys.argv[1], 2)
pg = dist.ProcessGroupGloo(store, 1, 2, __import__("datetime").timedelta(seconds=60))
t = torch.ones(1)
pg.allreduce([t]).wait()
print(int(t.item()))
"""


def test_gloo_builds_its_group_over_it_beside_a_file_store_peer(tmp_path):
    """What ``init_rpc`` does on rank 0 with it: a Gloo group whose peer opened the same
    file as torch's own file:// rendezvous does."""
    import datetime

    import torch

    path = str(tmp_path / "rpc-1")
    peer = subprocess.Popen([sys.executable, "-c", GLOO_PEER, path], stdout=subprocess.PIPE,
                            text=True)
    try:
        store = ClosableStore(dist.FileStore(path, 2), 60.0)
        pg = dist.ProcessGroupGloo(store, 0, 2, datetime.timedelta(seconds=60))
        t = torch.ones(1)
        pg.allreduce([t]).wait()
        assert int(t.item()) == 2
        out, _ = peer.communicate(timeout=60)
        assert out.strip().splitlines()[-1] == "2"  # torch 2.8's Gloo logs to stdout first
    finally:
        peer.kill()
        peer.wait()
