"""Large tensors between local ranks through the shared-memory arena (``shm/transport.py``):
values, dtypes, strides and aliasing kept, what keeps TensorPipe's path, slots of a killed rank
taken back, no growth over many calls, nothing left after stop, and the switch that turns it
off. Real worlds, real RPC."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from conftest import wait_until

from nbdist.shm import transport as shm

MB = 1 << 20
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128)
_kept: list = []


def echo(x):
    return x


def usage():
    return shm.usage()


def checksum(x):
    if x.dtype.is_complex:
        x = torch.view_as_real(x)
    return float(x.double().sum()) if x.dtype != torch.bool else int(x.sum())


def keep(x):
    _kept.append(x)
    return len(_kept)


def aliasing(base, tail, tr):
    """On the callee: do the three arguments still share their storage?"""
    same = (base.untyped_storage().data_ptr() == tail.untyped_storage().data_ptr()
            == tr.untyped_storage().data_ptr())
    base[1, 0] = -7.0
    return same, float(tail[0, 0]), float(tr[0, 1]), tr.stride()


def slow_sum(x):
    time.sleep(0.2)
    return float(x.sum())


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def make(dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    t = torch.randn(shape, generator=g) * 50
    if dtype.is_complex:
        return torch.complex(t, -t).to(dtype)
    return t.to(dtype)


def shape_classes(dtype: torch.dtype) -> list[torch.Tensor]:
    n = (4 * MB) // torch.empty(0, dtype=dtype).element_size()  # 4 MB: over the threshold
    base = make(dtype, (n // 512, 512))
    return [base,  # contiguous 2-D
            make(dtype, (n,)),  # 1-D
            base.t(),  # transposed
            base[::2, 1:],  # strided slice of a larger storage
            make(dtype, (4, n // 4096, 32, 32)).contiguous(memory_format=torch.channels_last),
            make(dtype, (1,)).expand(n)]  # a zero stride


@pytest.fixture(autouse=True)
def path_on(monkeypatch):
    """These tests are about the path: on, even in a suite run with ``NBDIST_SHM=0``, and
    from 1 MB (their tensors are sized for that)."""
    monkeypatch.setenv("NBDIST_SHM", "1")
    monkeypatch.setenv("NBDIST_SHM_MIN_KB", "1024")


@pytest.fixture
def two(world):
    return world(2)


def test_values_dtypes_and_shapes_equal_both_ways(two):
    before = shm.usage()
    assert before is not None, "the path is on by default"
    for dtype in DTYPES:
        for t in shape_classes(dtype):
            back = rpc.rpc_sync("worker1", echo, args=(t,))
            assert back.dtype == dtype and back.shape == t.shape
            assert torch.equal(back, t), (dtype, t.shape, t.stride())
            assert rpc.rpc_sync("worker1", checksum, args=(t,)) == checksum(t)
    after, theirs = shm.usage(), rpc.rpc_sync("worker1", usage)
    n = len(DTYPES) * 6
    assert after["sent"] - before["sent"] >= 2 * n  # the arguments went the arena's way
    assert theirs["sent"] >= n  # and the results came back that way
    assert after["zero_copy"] - before["zero_copy"] >= n
    assert after["fallback"] == before["fallback"]


def test_both_copies_into_a_slot_keep_values(two):
    """A span from ``_THREADED_COPY_MIN`` is copied by torch's threads, a smaller one by one
    ``memmove`` (here from an offset inside a larger storage): both arrive exactly."""
    big = torch.randn(shm._THREADED_COPY_MIN // 4 + 17)
    before = shm.usage()["sent"]
    for t in (big, big[1001:1001 + MB], big[5:].view(-1)[:: 2]):
        back = rpc.rpc_sync("worker1", echo, args=(t,))
        assert torch.equal(back, t) and back.stride() == t.stride()
    assert shm.usage()["sent"] - before == 3


def test_rpc_async_remote_and_to_here(two):
    t = make(torch.float32, (1024, 1024))
    assert torch.equal(rpc.rpc_async("worker1", echo, args=(t,)).wait(), t)
    rref = rpc.remote("worker1", echo, args=(t,))
    assert torch.equal(rref.to_here(), t)
    assert torch.equal(rref.rpc_sync().clone(), t)  # an RRef proxy: a method of the value


def test_aliasing_and_strides_kept(two):
    base = torch.arange(4 * MB // 4, dtype=torch.float32).reshape(-1, 1024)
    same, tail00, tr01, stride = rpc.rpc_sync("worker1", aliasing,
                                              args=(base, base[1:], base.t()))
    assert same and tail00 == -7.0 and tr01 == -7.0 and stride == (1, 1024)
    assert base[1, 0] == 1024.0, "the caller's tensor is not changed by the callee"


def test_value_sent_is_the_value_at_call_time(two):
    x = torch.ones(MB)
    fut = rpc.rpc_async("worker1", slow_sum, args=(x,))
    x.zero_()  # after the call returned its future
    assert fut.wait() == float(MB)


def test_requires_grad_keeps_tensorpipe_and_gradients_flow(two):
    before = shm.usage()["sent"]
    with dist_autograd.context() as ctx:
        x = torch.randn(MB, requires_grad=True)
        y = rpc.rpc_sync("worker1", torch.mul, args=(x, 3.0))
        dist_autograd.backward(ctx, [y.sum()])
        grads = dist_autograd.get_gradients(ctx)
    assert torch.equal(grads[x], torch.full((MB,), 3.0))
    assert shm.usage()["sent"] == before


def test_the_same_bytes_on_their_way_to_one_rank_go_to_another_by_tensorpipe(two):
    """One copy of a tensor no rank took yet is enough: the same unchanged bytes to another
    rank meanwhile go TensorPipe's way (that receiver copies its own); changed, or once the
    first receiver took its copy, they take the arena again. Every value arrives exact."""
    x = torch.randn(MB)  # 4 MB
    first = x.clone()
    stopped = two.ranks[1].pid
    os.kill(stopped, signal.SIGSTOP)  # worker1 cannot take its message: it stays on its way
    try:
        before = shm.usage()
        fut = rpc.rpc_async("worker1", echo, args=(x,))
        wait_until(lambda: shm.usage()["sent"] == before["sent"] + 1, 10, "the first copy")
        assert torch.equal(rpc.rpc_sync("worker2", echo, args=(x,)), x)
        mid = shm.usage()
        assert (mid["sent"], mid["repeat"]) == (before["sent"] + 1, before["repeat"] + 1)
        x.add_(1)  # changed bytes: a copy of their own
        assert torch.equal(rpc.rpc_sync("worker2", echo, args=(x,)), x)
        assert (shm.usage()["sent"], shm.usage()["repeat"]) == (mid["sent"] + 1, mid["repeat"])
    finally:
        os.kill(stopped, signal.SIGCONT)
    assert torch.equal(fut.wait(), first)  # the value at call time
    again = shm.usage()
    for _ in range(3):  # taken: one rank after the other, each call copies again
        assert torch.equal(rpc.rpc_sync("worker1", echo, args=(x,)), x)
    assert shm.usage()["sent"] == again["sent"] + 3 and shm.usage()["repeat"] == again["repeat"]


def test_a_killed_ranks_slots_are_taken_back(world):
    c = world(2)
    x = torch.randn(4 * MB)
    for _ in range(3):
        rpc.rpc_sync("worker1", keep, args=(x,))  # worker1 keeps them: slots held there
    assert shm.usage()["used"] >= 3 * x.nbytes
    os.kill(c.ranks[1].pid, signal.SIGKILL)
    wait_until(lambda: shm.usage()["used"] == 0, 10, "the dead rank's slots to be free")
    assert torch.equal(rpc.rpc_sync("worker2", echo, args=(x,)), x)


@pytest.mark.slow
def test_many_large_calls_do_not_grow(two):
    x = torch.randn(MB // 2)  # 2 MB
    for _ in range(20):  # as the loop below: a result is held while the next one comes
        back = rpc.rpc_sync("worker1", echo, args=(x,))
    mine, theirs = shm.usage(), rpc.rpc_sync("worker1", usage)
    fds = (open_fds(), rpc.rpc_sync("worker1", open_fds))
    for _ in range(1000):
        back = rpc.rpc_sync("worker1", echo, args=(x,))
    assert torch.equal(back, x)
    del back
    mine2, theirs2 = shm.usage(), rpc.rpc_sync("worker1", usage)
    # flat: at most one more slot touched on a side (a reply still held when the next call
    # came, once, on a loaded machine; reused from then on), never one per call (1,000 here)
    assert mine2["faulted"] - mine["faulted"] <= 2 * MB, (mine, mine2)
    assert theirs2["faulted"] - theirs["faulted"] <= 2 * MB, (theirs, theirs2)
    assert mine2["sent"] - mine["sent"] >= 1000
    assert (open_fds(), rpc.rpc_sync("worker1", open_fds)) == fds


def _shm_links(pids) -> list[str]:
    found = []
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if "nbdist-shm" in os.readlink(f"/proc/{pid}/fd/{fd}"):
                        found.append(f"{pid}/{fd}")
                except OSError:
                    pass
            with open(f"/proc/{pid}/maps") as f:
                found += [f"{pid} maps" for line in f if "nbdist-shm" in line]
        except OSError:
            pass
    return found


def test_nothing_left_after_stop(world):
    dev_shm = set(os.listdir("/dev/shm"))
    c = world(2)
    pids = [c.ranks[r].pid for r in (1, 2)]
    x = torch.randn(4 * MB)
    back = rpc.rpc_sync("worker1", echo, args=(x,))
    rpc.rpc_sync("worker2", echo, args=(back,))
    assert _shm_links([os.getpid(), *pids])
    del back
    c.stop()
    assert _shm_links([os.getpid()]) == []
    assert set(os.listdir("/dev/shm")) <= dev_shm
    # a tensor received from a rank outlives the world; its mapping goes with it
    c = world(1)
    held = rpc.rpc_sync("worker1", echo, args=(x,))
    c.stop()
    assert torch.equal(held, x)
    del held
    assert _shm_links([os.getpid()]) == []


def test_switched_off(world, monkeypatch):
    monkeypatch.setenv("NBDIST_SHM", "0")
    world(1)
    assert shm.usage() is None and rpc.rpc_sync("worker1", usage) is None
    x = torch.randn(4 * MB)
    assert torch.equal(rpc.rpc_sync("worker1", echo, args=(x,)), x)


def test_other_hosts_keep_tensorpipe():
    """Ranks on other hosts are never sent to this way; replies take it only when every rank
    shares the host (a rank does not know who called it)."""
    placement, names = [None, None, "h1", "h1"], ["r0", "r1", "r2", "r3"]
    zero = shm.world_config(placement, names, 0)
    assert zero["local"] == ["r1"] and not zero["all_local"]
    assert shm.world_config(placement, names, 2)["local"] == ["r3"]
    assert shm.world_config([None, None], names[:2], 1)["all_local"]
    try:
        shm.open_world(zero)
        for dest, goes in (("r1", True), ("r2", False), (None, False)):
            outer = shm.begin(dest)
            assert (shm._THREAD_PER_PROCESS.msg is not None) == goes, dest
            shm.end(outer, None)
    finally:
        shm.close_world()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_keep_tensorpipe(world):
    world(1, device_maps="auto")
    before = shm.usage()["sent"]
    x = torch.randn(4 * MB, device="cuda")
    back = rpc.rpc_sync("worker1", echo, args=(x,))
    assert back.is_cuda and torch.equal(back, x)
    assert shm.usage()["sent"] == before


def test_status_shows_the_arenas(world):
    c = world(1)
    x = torch.randn(4 * MB)
    held = rpc.rpc_sync("worker1", echo, args=(x,))  # worker1's slot is held here
    table = c.status()
    assert table.columns[-1] == "shm MB used/faulted"
    rows = {r["rank"]: r for r in table.rows}
    assert rows[1]["shm"]["used"] >= x.nbytes and rows[0]["shm"]["faulted"] >= x.nbytes
    assert "16 / 16" in str(table)
    del held


def _all_shm_links() -> list[str]:
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    return _shm_links(pids)


@pytest.mark.slow
@pytest.mark.kernel
def test_nothing_left_after_a_killed_kernel(kernel):
    from conftest import wait_gone

    dev_shm = set(os.listdir("/dev/shm"))
    rep = kernel.execute("%load_ext nbdist\n%dist_start 2\nimport nbdist, torch\n"
                         "import torch.distributed.rpc as rpc\n"
                         "def keep(x):\n    global kept\n    kept = x\n    return x\n"
                         "held = rpc.rpc_sync('worker1', keep, args=(torch.ones(1 << 20),))\n"
                         "held2 = rpc.rpc_sync('worker2', keep, args=(held,))", timeout=120)
    assert rep.status == "ok", rep
    workers = kernel.value("nbdist.current().worker_pids()")
    assert _shm_links([kernel.pid, *workers])
    os.kill(kernel.pid, signal.SIGKILL)
    assert wait_gone(workers, 30.0) == []
    wait_until(lambda: not _all_shm_links(), 10, "no process to hold an arena")
    assert set(os.listdir("/dev/shm")) <= dev_shm


def kept_sum():
    return [float(t.sum()) for t in _kept]


def test_a_kept_worker_keeps_received_tensors_across_a_keep_restart(world):
    c = world(2)
    x = torch.ones(MB)
    rpc.rpc_sync("worker1", keep, args=(x,))  # over rank 0's arena of the old world
    c.restart(keep=True)
    assert rpc.rpc_sync("worker1", kept_sum) == [float(MB)]
    assert torch.equal(rpc.rpc_sync("worker1", echo, args=(x * 2,)), x * 2)  # the new arenas


def test_bounded_what_does_not_fit_goes_the_ordinary_way(world, monkeypatch):
    monkeypatch.setenv("NBDIST_SHM_MB", "8")
    world(1)
    small, big = torch.randn(MB), torch.randn(4 * MB)  # 4 MB and 16 MB
    before = rpc.rpc_sync("worker1", usage)
    assert rpc.rpc_sync("worker1", keep, args=(small,)) >= 1  # held there: 4 of 8 MB in use
    assert rpc.rpc_sync("worker1", keep, args=(small,)) >= 2  # more than half: copied out
    mid = rpc.rpc_sync("worker1", usage)
    assert mid["zero_copy"] - before["zero_copy"] == 1 and mid["copied"] - before["copied"] == 1
    mine = shm.usage()
    assert torch.equal(rpc.rpc_sync("worker1", echo, args=(big,)), big)  # 16 MB: over the size
    assert shm.usage()["fallback"] == mine["fallback"] + 1
    assert shm.usage()["faulted"] <= 8 * MB


# ------------------------------------------------------ many tensors in one message (issue 35)
def in_arena(xs):
    """On the callee: which tensors of ``xs`` lie in a peer's arena mapped here."""
    spans = [(p.addr, p.addr + p.length) for p in shm._mapped_peers() if p.addr]
    return [any(lo <= t.data_ptr() < hi for lo, hi in spans) for t in xs]


def mixed_message(seed: int = 0) -> list[torch.Tensor]:
    """Tensors of every kind in one message (threshold 1 MB): two small ones first (the
    message has not met 1 MB yet: TensorPipe), one over the threshold, then small and large
    ones of several dtypes, non-contiguous strides, a zero stride, and views sharing one
    storage (both over and under the threshold)."""
    g = torch.Generator().manual_seed(seed)
    big = torch.randn(512, 1024, generator=g)  # 2 MB
    shared = torch.randn(300, 200, generator=g).double()  # 480 KB, under
    return [torch.arange(10, dtype=torch.int64) + seed,  # under, before the mark
            torch.randn(7, 3, generator=g),  # under, before the mark
            big,  # over: the message met 1 MB
            big[::3, 5:900:2],  # a strided view of it
            big.t(),  # and its transpose
            shared,
            shared[10:20, ::7],  # aliasing a storage under the threshold
            shared.t()[1:],
            (torch.randn(4, 5, 6, 7, generator=g) * 20).to(torch.int8)
            .contiguous(memory_format=torch.channels_last),
            torch.randn(33, generator=g).to(torch.bfloat16),
            torch.complex(torch.randn(64, generator=g), torch.randn(64, generator=g)),
            torch.randn(1, generator=g).expand(2048),  # a zero stride
            torch.rand(5000, generator=g) > 0.5,  # bool
            torch.randn(1024, 384, generator=g).half()[:, ::2],  # 768 KB storage, strided
            torch.randn(MB // 2, generator=g)]  # 2 MB, over


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def assert_exact(back: list, sent: list) -> None:
    """Values, dtypes, shapes, strides and storage sharing as sent."""
    assert len(back) == len(sent)
    for i, (b, t) in enumerate(zip(back, sent, strict=True)):
        assert (b.dtype, b.shape, b.stride()) == (t.dtype, t.shape, t.stride()), i
        assert torch.equal(b, t), i
        for j in range(i):
            assert _same_storage(back[j], b) == _same_storage(sent[j], t), (j, i)
            if _same_storage(sent[j], t):  # the same places of the one storage
                assert (b.storage_offset() - back[j].storage_offset()
                        == t.storage_offset() - sent[j].storage_offset()), (j, i)


def test_many_mixed_tensors_in_one_message_round_trip_exactly(two):
    xs = mixed_message()
    before = shm.usage()
    back = rpc.rpc_sync("worker1", echo, args=(xs,))
    assert_exact(back, xs)
    after, theirs = shm.usage(), rpc.rpc_sync("worker1", usage)
    assert after["sent"] - before["sent"] == 1, "one span for the whole message"
    assert theirs["sent"] >= 1 and after["fallback"] == before["fallback"]
    # on the callee: the first two (before the message met the threshold) came through
    # TensorPipe, every later one, small or large, through the one span
    assert rpc.rpc_sync("worker1", in_arena, args=(xs,)) == [False, False] + [True] * 13
    assert in_arena(back) == [False, False] + [True] * 13  # and so came the reply
    same, tail00, tr01, _ = rpc.rpc_sync("worker1", aliasing,
                                         args=(xs[5], xs[5][1:], xs[5].t()))
    assert same and tail00 == -7.0 and tr01 == -7.0, "a storage under the threshold shared"


def test_small_tensors_alone_keep_tensorpipe(two):
    """A message that never meets the threshold is left as it was: no span, no descriptor."""
    xs = [torch.randn(64, 64) for _ in range(40)]  # 640 KB in all
    before = shm.usage()["sent"]
    back = rpc.rpc_sync("worker1", echo, args=(xs,))
    assert all(torch.equal(a, b) for a, b in zip(back, xs, strict=True))
    assert shm.usage()["sent"] == before
    assert rpc.rpc_sync("worker1", in_arena, args=(xs,)) == [False] * 40
    # 256 KB each: the 4th meets 1 MB; those from there take a span if they hold 1 MB
    ys = [torch.randn(256, 256) for _ in range(8)]
    assert rpc.rpc_sync("worker1", in_arena, args=(ys[:6],)) == [False] * 6
    assert shm.usage()["sent"] == before
    assert rpc.rpc_sync("worker1", in_arena, args=(ys,)) == [False] * 3 + [True] * 5
    assert shm.usage()["sent"] == before + 1


def _settled() -> tuple[dict, dict]:
    """Both arenas' usage once every slot is free again (a callee frees a request's tensors
    a moment after its reply went)."""
    got: list = []

    def free() -> bool:
        got[:] = [shm.usage(), rpc.rpc_sync("worker1", usage, timeout=30)]
        return got[0]["used"] == 0 and got[1]["used"] == 0

    wait_until(free, 10, "every slot of both arenas to be free")
    return got[0], got[1]


def test_a_thousand_mixed_messages_leave_the_arena_and_descriptors_flat(two):
    for i in range(3):  # warm: slots carved, peers mapped
        back = rpc.rpc_sync("worker1", echo, args=(mixed_message(i),))
    del back
    mine, theirs = _settled()
    fds = (open_fds(), rpc.rpc_sync("worker1", open_fds))
    xs = mixed_message(7)
    deadline = time.monotonic() + 240
    for i in range(1000):
        back = rpc.rpc_sync("worker1", echo, args=(xs,), timeout=60)
        if i % 100 == 0:
            assert_exact(back, xs)
        assert time.monotonic() < deadline, f"1000 messages took over 240 s (at {i})"
    assert_exact(back, xs)
    del back
    mine2, theirs2 = _settled()
    for key in ("used", "faulted", "slots"):
        assert (mine2[key], theirs2[key]) == (mine[key], theirs[key]), key
    assert mine2["sent"] - mine["sent"] == 1000 and theirs2["sent"] - theirs["sent"] >= 1000
    assert mine2["fallback"] == mine["fallback"]
    assert (open_fds(), rpc.rpc_sync("worker1", open_fds)) == fds
