"""Every tensor kind as torch's RPC sends it (issue 41, item 2), through every way nbdist sends
one: ``rpc_sync``, ``rpc_async``, ``remote(...).to_here()``, an RRef proxy, a view's ``call``,
``push`` and ``scatter``, with the shared-memory path on (from 1 KB, so small tensors take it
too) and off. Hypothesis builds the values: sparse COO (coalesced or not, with grad), complex
and its lazy conj/neg views, bool, bfloat16, float8, 0-dim, empty, transposed and strided
views, requires_grad, jagged nested, quantized (per tensor and per channel), inside lists,
tuples, dicts and an instance of a notebook class. What comes back equals what was sent as
plain torch gives it (values bit for bit, dtype, layout, shape, strides, requires_grad); a
meta tensor, which plain torch's RPC refuses with RuntimeError, is refused with the same.

Kinds left out on purpose: compressed sparse (CSR/CSC/BSR/BSC), strided nested and mkldnn
tensors abort plain torch's process in TensorPipe's serializer (an uncaught C++ exception), so
there is no plain-torch behaviour to equal. Real worlds, real RPC.
"""

from __future__ import annotations

import torch
import torch.distributed.rpc as rpc
from hypothesis import HealthCheck, given, settings, strategies as st

from nbdist.shm import transport as shm
from nbdist.telemetry import tracing

_CELL = '''
import torch.distributed.rpc as rpc

from nbdist.shm import transport as shm


class Box:
    """A class defined in a notebook cell: travels by value."""

    def __init__(self, value):
        self.value = value


class Keeper:
    """Owned by a worker behind an RRef; ``echo`` is called through the RRef's proxy."""

    def echo(self, value):
        return value


def echo(value):
    return value


def shm_usage():
    return shm.usage()
'''
_ns: dict = {"__name__": "__main__"}
exec(compile(_CELL, "<notebook-cell-tensor-kinds>", "exec"), _ns)
Box, Keeper, echo, shm_usage = (_ns[k] for k in ("Box", "Keeper", "echo", "shm_usage"))

SMALL, LARGE = 6, 2048  # elements: under and (at 1 KB from 256 floats) over the threshold


def _dense(dtype: torch.dtype, n: int, g: torch.Generator) -> torch.Tensor:
    t = torch.randn(n, generator=g) * 4
    if dtype.is_complex:
        return torch.complex(t, -t).to(dtype)
    if dtype == torch.bool:
        return t > 0
    return t.to(dtype)


def make(kind: str, n: int, seed: int) -> torch.Tensor:
    """A tensor of ``kind`` with about ``n`` elements (``n`` >= 6)."""
    g = torch.Generator().manual_seed(seed)
    if kind in DENSE_DTYPES:
        return _dense(DENSE_DTYPES[kind], n, g)
    if kind == "zero_dim":
        return torch.tensor(float(seed))
    if kind == "empty":
        return torch.empty(0, 3)
    if kind == "transposed":
        return _dense(torch.float32, n - n % 2, g).reshape(2, -1).t()
    if kind == "strided_slice":
        return _dense(torch.float64, 2 * n, g)[1::2]
    if kind == "expanded":
        return _dense(torch.float32, 1, g).expand(n)
    if kind == "channels_last":
        return _dense(torch.float32, 4 * n, g).reshape(1, 4, n // 2, 2).contiguous(
            memory_format=torch.channels_last)
    if kind == "conj":
        return _dense(torch.complex64, n, g).conj()
    if kind == "neg":
        return _dense(torch.complex128, n, g).conj().imag
    if kind == "requires_grad":
        return _dense(torch.float32, n, g).requires_grad_()
    if kind in ("sparse_coo", "sparse_coo_coalesced", "sparse_coo_grad"):
        idx = torch.randint(0, n, (2, n // 2), generator=g)
        s = torch.sparse_coo_tensor(idx, _dense(torch.float32, n // 2, g), (n, n))
        if kind == "sparse_coo_coalesced":
            s = s.coalesce()
        return s.requires_grad_() if kind == "sparse_coo_grad" else s
    if kind == "sparse_coo_complex":
        idx = torch.randint(0, n, (1, n // 2), generator=g)
        return torch.sparse_coo_tensor(idx, _dense(torch.complex64, n // 2, g), (n,))
    if kind == "nested_jagged":
        return torch.nested.nested_tensor([_dense(torch.float32, 2 * k, g).reshape(k, 2)
                                           for k in (1, n // 2, 3)], layout=torch.jagged)
    if kind == "quantized":
        return torch.quantize_per_tensor(_dense(torch.float32, n, g), 0.1, 3, torch.quint8)
    if kind == "quantized_per_channel":
        return torch.quantize_per_channel(_dense(torch.float32, 2 * n, g).reshape(2, n),
                                          torch.tensor([0.1, 0.2]), torch.tensor([0, 1]), 0,
                                          torch.qint8)
    if kind == "meta":
        return torch.empty(n, device="meta")
    raise AssertionError(kind)


DENSE_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                "bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn,
                "float8_e5m2": torch.float8_e5m2, "int8": torch.int8, "uint8": torch.uint8,
                "int64": torch.int64, "uint16": torch.uint16, "bool": torch.bool,
                "complex64": torch.complex64, "complex128": torch.complex128}
KINDS = [*DENSE_DTYPES, "zero_dim", "empty", "transposed", "strided_slice", "expanded",
         "channels_last", "conj", "neg", "requires_grad", "sparse_coo", "sparse_coo_coalesced",
         "sparse_coo_grad", "sparse_coo_complex", "nested_jagged", "quantized",
         "quantized_per_channel"]
REFUSED = {"meta": RuntimeError}  # plain torch: "TensorPipe RPC backend only supports CPU ..."


# -- comparing as plain torch's echo compares -------------------------------------------------
def _bits(t: torch.Tensor) -> torch.Tensor:
    """Dense values as exact integers (float8 has no ==, NaN != NaN)."""
    t = t.resolve_conj().resolve_neg()
    if t.dtype.is_complex:
        t = torch.view_as_real(t)
    if t.dtype.is_floating_point:
        t = t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32,
                                 8: torch.int64}[t.element_size()])
    return t


def _strides(t: torch.Tensor) -> tuple:
    """The strides a received ``t`` may have: its own, or where plain torch's RPC copies it
    first (``cloneSparseTensors`` in torch/csrc/distributed/rpc/utils.cpp: a view using under
    half of a storage of 8 KB or more) those of its clone. The shared-memory path keeps a
    view's strides (it copies the span the view covers, not a compacted clone)."""
    storage = t.untyped_storage().nbytes()
    if storage >= 8 * 1024 and storage >= 2 * t.numel() * t.element_size():
        return (t.stride(), t.clone().stride())
    return (t.stride(),)


def assert_same_tensor(back: torch.Tensor, sent: torch.Tensor, where: str) -> None:
    assert type(back) is type(sent), where
    assert (back.dtype, back.layout, back.requires_grad, back.device) == \
        (sent.dtype, sent.layout, sent.requires_grad, sent.device), where
    if not sent.is_nested:  # a jagged dimension is a new symbol in each process (j1, j2)
        assert back.shape == sent.shape, where
    sent, back = sent.detach(), back.detach()
    if sent.is_nested:
        assert torch.equal(back.offsets(), sent.offsets()), where
        assert torch.equal(_bits(back.values()), _bits(sent.values())), where
    elif sent.layout == torch.sparse_coo:
        # is_coalesced is not compared: plain torch's RPC sends it back False
        assert torch.equal(back._indices(), sent._indices()), where
        assert torch.equal(_bits(back._values()), _bits(sent._values())), where
    elif sent.is_quantized:
        assert back.qscheme() == sent.qscheme(), where
        assert torch.equal(back.int_repr(), sent.int_repr()), where
        if sent.qscheme() == torch.per_tensor_affine:
            assert (back.q_scale(), back.q_zero_point()) == (sent.q_scale(),
                                                             sent.q_zero_point()), where
        else:
            assert torch.equal(back.q_per_channel_scales(), sent.q_per_channel_scales())
    else:
        assert back.stride() in _strides(sent), (where, back.stride(), _strides(sent))
        # plain torch keeps a lazy conj bit and resolves a neg bit (values as read the same)
        assert back.is_conj() == sent.is_conj(), where
        assert torch.equal(_bits(back), _bits(sent)), where


def assert_same(back, sent, where: str = "") -> None:
    if isinstance(sent, torch.Tensor):
        assert_same_tensor(back, sent, where)
    elif isinstance(sent, (list, tuple)):
        assert type(back) is type(sent) and len(back) == len(sent), where
        for i, (b, s) in enumerate(zip(back, sent, strict=True)):
            assert_same(b, s, f"{where}[{i}]")
    elif isinstance(sent, dict):
        assert type(back) is dict and list(back) == list(sent), where
        for k in sent:
            assert_same(back[k], sent[k], f"{where}[{k!r}]")
    else:
        assert type(back).__name__ == type(sent).__name__ == "Box", where
        assert_same(back.value, sent.value, f"{where}.value")


# -- what hypothesis builds --------------------------------------------------------------------
tensors = st.builds(make, st.sampled_from(KINDS), st.sampled_from([SMALL, LARGE]),
                    st.integers(0, 2**16))
values = st.recursive(tensors, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(st.sampled_from(["a", "b", "w"]), inner, max_size=3),
    inner.map(Box)), max_leaves=5)

PATHS = ("rpc_sync", "rpc_async", "remote", "rref_proxy", "view_call", "view_push",
         "view_scatter")


def send(c, path: str, value):
    """``value`` to worker1 and back the way ``path`` sends it."""
    if path == "rpc_sync":
        return rpc.rpc_sync("worker1", echo, args=(value,))
    if path == "rpc_async":
        return rpc.rpc_async("worker1", echo, args=(value,)).wait()
    if path == "remote":
        return rpc.remote("worker1", echo, args=(value,)).to_here()
    if path == "rref_proxy":
        return rpc.remote("worker1", Keeper).rpc_sync().echo(value)
    if path == "view_call":
        got = c[:].call(echo, value)
        assert sorted(got) == [1, 2]
        assert_same(got[2], value, "rank 2")
        return got[1]
    if path == "view_push":
        c[:].push({"kinds_value": value})
        got = c[:].pull("kinds_value")
        assert_same(got[2], value, "rank 2")
        return got[1]
    if path == "view_scatter":  # a share for each rank: [value] and [value, value]
        c[:].scatter("kinds_share", [value, value, value])
        got = c[:].pull("kinds_share")
        assert len(got[1]) == 2 and len(got[2]) == 1
        assert_same(got[2][0], value, "rank 2")
        return got[1][1]
    raise AssertionError(path)


def _round_trips(c) -> None:
    @settings(max_examples=100, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(value=values, path=st.sampled_from(PATHS))
    def round_trip(value, path):
        assert_same(send(c, path, value), value, path)

    round_trip()


def _every_kind_on_every_path(c) -> None:
    """Each kind, small and large, on each path once (hypothesis samples the combinations)."""
    for kind in KINDS:
        for n in (SMALL, LARGE):
            for path in PATHS:
                t = make(kind, n, 7)
                assert_same(send(c, path, t), t, f"{kind} n={n} via {path}")
    for kind, etype in REFUSED.items():
        for path in ("rpc_sync", "rpc_async", "remote"):
            try:
                send(None, path, make(kind, SMALL, 0))
            except Exception as exc:  # noqa: BLE001
                assert isinstance(exc, etype), (kind, path, exc)
            else:
                raise AssertionError(f"{kind} via {path}: plain torch refuses it")


def test_every_kind_round_trips_with_the_shared_memory_path_on(world, monkeypatch):
    monkeypatch.setenv("NBDIST_TRACE", "1")  # tracing counts every message's bytes
    monkeypatch.setenv("NBDIST_SHM", "1")
    monkeypatch.setenv("NBDIST_SHM_MIN_KB", "1")  # 1 KB: the large examples take the path
    c = world(2)
    assert tracing.enabled()
    before, theirs = shm.usage()["sent"], rpc.rpc_sync("worker1", shm_usage)["sent"]
    _every_kind_on_every_path(c)
    _round_trips(c)
    assert shm.usage()["sent"] > before, "no message took the shared-memory path"
    assert rpc.rpc_sync("worker1", shm_usage)["sent"] > theirs, "no reply took it"


def test_every_kind_round_trips_with_the_shared_memory_path_off(world, monkeypatch):
    monkeypatch.setenv("NBDIST_TRACE", "1")
    monkeypatch.setenv("NBDIST_SHM", "0")
    c = world(2)
    assert shm.usage() is None
    _every_kind_on_every_path(c)
    _round_trips(c)


def test_payload_bytes_counts_what_each_kind_carries_and_never_raises():
    """Tracing's count: a sparse tensor's parts, not its dense size (``nbytes`` refuses COO
    and counts a compressed one as dense); nothing for a meta tensor; kinds plain torch cannot
    send (compressed sparse, strided nested, mkldnn) counted too, without raising."""
    d = torch.randn(4, 6)
    for kind in [*KINDS, *REFUSED]:
        for n in (SMALL, LARGE):
            assert tracing.payload_bytes(make(kind, n, 1)) >= 0, kind
    coo = make("sparse_coo", SMALL, 1)
    assert tracing.payload_bytes(coo) == coo._indices().nbytes + coo._values().nbytes
    csr, csc = d.to_sparse_csr(), d.to_sparse_csc()
    assert tracing.payload_bytes(csr) == (csr.crow_indices().nbytes + csr.col_indices().nbytes
                                          + csr.values().nbytes)
    assert tracing.payload_bytes(csc) == (csc.ccol_indices().nbytes + csc.row_indices().nbytes
                                          + csc.values().nbytes)
    for blocked in (d.to_sparse_bsr((2, 2)), d.to_sparse_bsc((2, 2))):
        assert tracing.payload_bytes(blocked) > blocked.values().nbytes
    assert tracing.payload_bytes(torch.empty(1000, device="meta")) == 0
    assert tracing.payload_bytes(make("nested_jagged", SMALL, 1)) == (1 + 3 + 3) * 2 * 4
    strided_nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    assert tracing.payload_bytes(strided_nested) == 5 * 4
    assert tracing.payload_bytes(d.to_mkldnn()) == 0 or tracing.payload_bytes(d.to_mkldnn()) \
        == d.nbytes
    t = make("strided_slice", LARGE, 1)
    assert tracing.payload_bytes(t) == t.nbytes
