"""Large CPU tensors in RPC messages through shared memory, between ranks of one host.

With this path on, ``shipping``'s tensor reducer is ours: a CPU tensor of at least
``min_bytes`` in a message to a rank on this host is copied once into a slot of this rank's
``arena.Arena`` and only a small descriptor goes on TensorPipe; the receiver maps the arena and
gets tensors over the slot, which returns to the sender's pool when the last is freed. Once
a message met ``min_bytes`` of tensors, its smaller CPU tensors join the same slot (a state
dict or a list of gradients: one span), if those hold ``min_bytes`` too. Everything else
(grad, non-CPU, sparse, other hosts, no room) keeps TensorPipe's path; the full list is in
docs/how-it-works.md. ``NBDIST_SHM=0`` turns the path off.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import threading
import weakref
from collections.abc import Callable
from typing import Any

from .. import world_state
from ..envflag import switched_on
from .arena import Arena, PeerArena

__all__ = ["DEFAULT_MB", "DEFAULT_MIN_KB", "begin", "close_world", "end", "open_world",
           "settings", "tensor_reducer", "usage", "use_tables", "world_config"]

DEFAULT_MB = 1024  # NBDIST_SHM_MB: each rank's arena (faulted in only as far as it is used)
DEFAULT_MIN_KB = 2048  # NBDIST_SHM_MIN_KB: smaller tensors go the ordinary way (why this
# threshold: bench/results/notes.md)
PACK_MIN = 1  # from this size a tensor under the threshold joins its message's span once the
# message met the threshold's bytes (no floor: why in bench/results/notes.md)
_GROUP_ALIGN = 64
_THREADED_COPY_MIN = 64 << 20  # a span this large is copied by torch's threads


def settings() -> dict | None:
    """The path's settings from this process's environment, or None when switched off."""
    if not switched_on("NBDIST_SHM"):
        return None
    try:
        mb = int(os.environ.get("NBDIST_SHM_MB", DEFAULT_MB))
        min_kb = int(os.environ.get("NBDIST_SHM_MIN_KB", DEFAULT_MIN_KB))
    except ValueError as exc:
        raise ValueError(f"NBDIST_SHM_MB and NBDIST_SHM_MIN_KB take whole numbers: {exc}") \
            from None
    return None if mb <= 0 else {"mb": mb, "min_kb": max(min_kb, 1)}


class _Config:
    def __init__(self, cfg: dict, local: set[str], all_local: bool) -> None:
        self.size = cfg["mb"] << 20
        self.min_bytes = cfg["min_kb"] << 10
        self.pack_bytes = PACK_MIN
        self.local, self.all_local = local, all_local


class _ShmWorld:
    """This process's side of the path in its world (a ``world_state`` part): the settings,
    its own arena (made at the first large message) and the peers' arenas mapped here."""

    def __init__(self) -> None:
        self.config: _Config | None = None
        self.arena: Arena | None = None
        self.peers: dict[tuple[int, int], PeerArena] = {}
        # the bytes last copied into a slot -> (slot, generation): see ``_seal``
        self.copied: dict[tuple, tuple[int, int]] = {}

    def close(self) -> None:
        """The arena's descriptor and mapping go (peers keep what they hold); mappings of
        peers' arenas go as soon as nothing here holds their slots."""
        with _LOCK_PER_PROCESS:
            self.config = None
            arena, self.arena = self.arena, None
            peers = list(self.peers.values())
            self.peers.clear()
        if arena is not None:
            arena.close()
        for p in peers:
            p.retire()

    def in_forked_child(self) -> None:
        """A forked child is not a rank of its parent's world: only the descriptor goes."""
        if self.arena is not None:
            try:
                os.close(self.arena.fd)
            except OSError:
                pass


def _current_config() -> _Config | None:
    """The current world's settings (benches tune them), None when the path is off here."""
    world = world_state.peek(_ShmWorld)
    return world.config if world is not None else None


def _mapped_peers() -> list[PeerArena]:
    """The peers' arenas mapped here in the current world (tests look into them)."""
    world = world_state.peek(_ShmWorld)
    return list(world.peers.values()) if world is not None else []


_LOCK_PER_PROCESS = threading.Lock()


class _TorchRefs:
    """Per process: torch's thread-local tensor tables (``shipping`` hands them over) and the
    empty tensor that holds a message's descriptor slot in them until it is written."""

    thread_tables: Any = None
    empty: Any = None


_TORCH_PER_PROCESS = _TorchRefs()


class _Message:
    """The tensors of one message being pickled, and where its descriptor goes."""

    __slots__ = ("desc_index", "min_bytes", "noted", "pack_bytes", "seen", "tensors")

    def __init__(self, min_bytes: int, pack_bytes: int) -> None:
        self.min_bytes, self.pack_bytes = min_bytes, pack_bytes
        self.tensors: list = []
        self.desc_index = -1
        self.seen = 0  # bytes of the tensors met so far (every path)
        self.noted = 0  # bytes of ``tensors``


class _Tls(threading.local):
    msg: _Message | None = None
    recv: Any = None  # (descriptor tensor, tensors not handed out yet, count left)


_THREAD_PER_PROCESS = _Tls()


def use_tables(thread_tables: Any) -> None:
    """torch's thread-local tensor tables (``shipping.install`` hands them over)."""
    _TORCH_PER_PROCESS.thread_tables = thread_tables


def world_config(placement: list, names: list[str], rank: int) -> dict | None:
    """What rank ``rank`` of a world laid out as ``placement`` (each rank's host) needs:
    ``settings()`` plus the names of the ranks on its host, and whether all are."""
    cfg = settings()
    if cfg is None:
        return None
    here = placement[rank]
    return {**cfg, "local": [n for i, n in enumerate(names) if placement[i] == here
                             and i != rank],
            "all_local": all(h == here for h in placement)}


def open_world(cfg: dict | None) -> None:
    """A world starts: send large tensors this way to ``cfg["local"]`` names (and replies
    too when ``cfg["all_local"]``); None (``world_config`` said off) leaves the path off."""
    close_world()
    if cfg is None or _TORCH_PER_PROCESS.thread_tables is None:
        return
    if _TORCH_PER_PROCESS.empty is None:
        import torch

        _TORCH_PER_PROCESS.empty = torch.empty(0, dtype=torch.uint8)
    world_state.part(_ShmWorld).config = _Config(cfg, set(cfg["local"]), cfg["all_local"])


def close_world() -> None:
    """This process's side of the path ends now (``world_state.end`` ends it with the world):
    see ``_ShmWorld.close``."""
    world = world_state.peek(_ShmWorld)
    if world is not None:
        world.close()


# messages, this process: sent through the arena, ``fallback`` (no room), ``repeat`` (the same
# bytes already on their way to another rank: TensorPipe's), received ``zero_copy``/``copied``
_COUNTS_PER_PROCESS = {"sent": 0, "fallback": 0, "repeat": 0, "zero_copy": 0, "copied": 0}


def usage() -> dict | None:
    """This rank's arena (bytes ``used``, ``faulted`` in, ``size``, after taking back the
    slots of dead holders) and message counts since the process started (``sent`` through
    the arena, ``fallback``: did not fit; received ``zero_copy`` or ``copied``); None when
    the path is off."""
    world = world_state.peek(_ShmWorld)
    cfg, arena = (world.config, world.arena) if world is not None else (None, None)
    if cfg is None:
        return None
    if arena is None:
        return {"used": 0, "faulted": 0, "size": cfg.size, "slots": 0, **_COUNTS_PER_PROCESS}
    return {**arena.usage(), **_COUNTS_PER_PROCESS}


def begin(dest: str | None) -> _Message | None:
    """Before pickling a message to ``dest`` (None: a reply): note its large tensors if it
    goes to this host. Returns what ``end`` restores (pickling can nest)."""
    prev = _THREAD_PER_PROCESS.msg
    cfg = _current_config()
    if cfg is None or not (cfg.all_local if dest is None else dest in cfg.local):
        _THREAD_PER_PROCESS.msg = None
    else:
        _THREAD_PER_PROCESS.msg = _Message(cfg.min_bytes, cfg.pack_bytes)
    return prev


def end(prev: _Message | None, send_tables: list | None) -> None:
    """After pickling: copy the noted tensors into a slot and put the descriptor in
    ``send_tables`` (None: pickling failed, nothing goes)."""
    msg = _THREAD_PER_PROCESS.msg
    _THREAD_PER_PROCESS.msg = prev
    if msg is not None and msg.tensors and send_tables is not None:
        send_tables[msg.desc_index] = _seal(msg.tensors, send_tables,
                                            msg.noted >= msg.min_bytes)


def tensor_reducer(orig: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """torch's tensor reducer, or a reference into shared memory for a CPU tensor of at least
    ``min_bytes``, or of at least ``PACK_MIN`` once the message met ``min_bytes`` of tensors
    (a state dict, a list of gradients: one span for most of their bytes)."""
    import torch

    strided = torch.strided

    def reduce(t: Any) -> Any:
        msg = _THREAD_PER_PROCESS.msg
        if msg is None:
            return orig(t)
        # only a dense CPU tensor's bytes can be copied as they are: anything else (sparse,
        # nested, quantized, lazy conj/neg views, another device) goes torch's way untouched
        if (t.layout is not strided or t.is_nested or t.requires_grad or t.device.type != "cpu"
                or t.is_quantized or t.is_conj() or t.is_neg()):
            return orig(t)
        n = t.nbytes
        msg.seen += n
        if n < msg.min_bytes and (n < msg.pack_bytes or msg.seen < msg.min_bytes):
            return orig(t)
        if msg.desc_index < 0:
            tables = _TORCH_PER_PROCESS.thread_tables.send_tables
            tables.append(_TORCH_PER_PROCESS.empty)
            msg.desc_index = len(tables) - 1
        msg.tensors.append(t)
        msg.noted += n
        return (_receive, (msg.desc_index, len(msg.tensors) - 1))

    return reduce


def _get_arena(world: _ShmWorld) -> Arena | None:
    """``world``'s own arena, made at its first large message (None: the path is off)."""
    with _LOCK_PER_PROCESS:
        cfg = world.config
        if world.arena is None and cfg is not None:
            try:
                world.arena = Arena(cfg.size)
            except OSError as exc:
                import sys

                print(f"nbdist: no shared-memory arena ({exc}); large tensors take "
                      "TensorPipe", file=sys.stderr)
                world.config = None
        return world.arena


def _u8(addr: int, nbytes: int) -> Any:
    import torch

    return torch.frombuffer((ctypes.c_char * nbytes).from_address(addr), dtype=torch.uint8)


def _copy(dst: int, storage: Any, lo: int, nbytes: int) -> None:
    """Copy bytes ``lo``..``lo + nbytes`` of ``storage`` to address ``dst``: one ``memmove``
    in this thread (GIL released) below ``_THREADED_COPY_MIN``, torch's threaded copy above
    (waking torch's thread pool costs more than it saves below; bench/shm/shm_fixed_cost.py)."""
    if nbytes < _THREADED_COPY_MIN:
        ctypes.memmove(dst, storage.data_ptr() + lo, nbytes)
        return
    import torch

    src = torch.empty(0, dtype=torch.uint8).set_(storage, lo, (nbytes,), (1,))
    _u8(dst, nbytes).copy_(src)


def _seal(tensors: list, send_tables: list, span: bool = True) -> Any:
    """Lay the tensors out by storage, copy them into one slot, return the descriptor; with
    ``span`` False (too few bytes to be worth a slot) or no room, they go in the table."""
    import torch

    groups: dict[int, list] = {}  # storage address -> [storage, lo, hi]
    keys = []
    for t in tensors:
        es = t.element_size()
        lo = t.storage_offset() * es
        if t.is_contiguous():
            hi = lo + t.nbytes
        else:
            hi = lo + (sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))
                       + 1) * es
        storage = t.untyped_storage()
        key = storage.data_ptr()
        g = groups.get(key)
        if g is None:
            groups[key] = [storage, lo, hi]
        else:
            g[1], g[2] = min(g[1], lo), max(g[2], hi)
        keys.append(key)
    layout, total = {}, 0
    for key, g in groups.items():
        g[1] -= g[1] % _GROUP_ALIGN
        layout[key] = (len(layout), total)
        total += -(-(g[2] - g[1]) // _GROUP_ALIGN) * _GROUP_ALIGN
    world = world_state.peek(_ShmWorld) if span else None
    arena = _get_arena(world) if world is not None else None
    seen, repeat = None, False
    if arena is not None:
        # the same bytes (storages, ranges, versions) copied for a message no rank took yet:
        # the model a server returns to each of its trainers. A second copy by this thread
        # would hold them all up; TensorPipe lets each receiver copy its own
        seen = (tuple((k, g[1], g[2]) for k, g in groups.items()),
                tuple(t._version for t in tensors))
        earlier = world.copied.get(seen)
        if earlier is not None and arena.unclaimed(*earlier):
            arena, repeat = None, True
            _COUNTS_PER_PROCESS["repeat"] += 1
    got = arena.alloc(total) if arena is not None else None
    if got is None:  # no room (or not worth a slot): every noted tensor goes the ordinary way
        if span and not repeat:
            _COUNTS_PER_PROCESS["fallback"] += 1
        desc: tuple = ("t", [_table_append(send_tables, t) for t in tensors])
    else:
        slot, offset, gen = got
        try:
            out = []
            for key, (_, goff) in layout.items():
                storage, lo, hi = groups[key]
                _copy(arena.addr + offset + goff, storage, lo, hi - lo)
                out.append((goff, hi - lo))
        except BaseException:
            arena.release(slot)
            raise
        finally:
            arena.written()
        entries = []
        for t, key in zip(tensors, keys, strict=True):
            gi, _ = layout[key]
            es = t.element_size()
            entries.append((gi, str(t.dtype)[6:], tuple(t.shape), t.stride(),
                            (t.storage_offset() * es - groups[key][1]) // es))
        _COUNTS_PER_PROCESS["sent"] += 1
        if seen is not None:
            if len(world.copied) >= 64:
                world.copied.clear()
            world.copied[seen] = (slot, gen)
        desc = ("s", arena.pid, arena.fd, arena.token, arena.length, slot, gen, offset, out,
                entries)
    data = pickle.dumps(desc, protocol=pickle.HIGHEST_PROTOCOL)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _table_append(send_tables: list, t: Any) -> int:
    send_tables.append(t)
    return len(send_tables) - 1


def _receive(desc_index: int, k: int) -> Any:
    """Unpickling hook: tensor ``k`` of the message whose descriptor is ``desc_index``."""
    recv = _TORCH_PER_PROCESS.thread_tables.recv_tables
    desc_t = recv[desc_index]
    cache = _THREAD_PER_PROCESS.recv
    if cache is None or cache[0] is not desc_t:
        tensors = _decode(ctypes.string_at(desc_t.data_ptr(), desc_t.numel()), recv)
        cache = _THREAD_PER_PROCESS.recv = [desc_t, tensors, len(tensors)]
    t, cache[1][k] = cache[1][k], None  # pickle asks for each tensor once (its memo)
    cache[2] -= 1
    if cache[2] <= 0:
        _THREAD_PER_PROCESS.recv = None  # hold nothing of a message once it is unpickled
    return t


def _peer(pid: int, fd: int, token: int, length: int) -> PeerArena:
    """The sender's arena mapped here, pinned (a world closing meanwhile keeps it mapped)."""
    key = (pid, token)
    world = world_state.peek(_ShmWorld)
    with _LOCK_PER_PROCESS:
        peer = world.peers.get(key) if world is not None else None
        if peer is None:
            peer = PeerArena(pid, fd, token, length)
            if world is not None and world.config is not None:
                world.peers[key] = peer
            else:  # used for this message only, then retired
                peer.retired = True
        if not peer.pin():
            raise RuntimeError(f"nbdist shm: process {pid}'s arena is no longer mapped here")
        return peer


def _decode(data: bytes, recv: list) -> list:
    import torch

    desc = pickle.loads(data)
    if desc[0] == "t":
        return [recv[i] for i in desc[1]]
    _, pid, fd, token, length, slot, gen, offset, groups, entries = desc
    peer = _peer(pid, fd, token, length)
    try:
        peer.check(slot, gen)
    except BaseException:
        peer.unpin()
        raise
    peer.hold(slot)
    fin = None
    try:
        zero_copy = not peer.half_full()
        if zero_copy:  # one buffer over the span; each storage a view of it; the slot goes
            span = groups[-1][0] + groups[-1][1]  # back when the last of them is freed
            peer.prefault(offset, span)
            buf = (ctypes.c_char * span).from_address(peer.addr + offset)
            fin = weakref.finalize(buf, peer.give_back, slot)
            fin.atexit = False
            bases = [torch.frombuffer(buf, dtype=torch.uint8, count=n, offset=goff)
                     for goff, n in groups]
            del buf
        else:
            bases = []
            for goff, n in groups:
                base = torch.empty(n, dtype=torch.uint8)
                _copy(base.data_ptr(), _u8(peer.addr + offset + goff, n).untyped_storage(),
                      0, n)
                bases.append(base)
    except BaseException:
        if fin is None or fin.detach() is not None:
            peer.give_back(slot)
        raise
    if not zero_copy:
        peer.give_back(slot)
    _COUNTS_PER_PROCESS["zero_copy" if zero_copy else "copied"] += 1
    storages = [b.untyped_storage() for b in bases]
    out = []
    dtypes: dict[str, Any] = {}
    for gi, dtype, shape, stride, soff in entries:
        dt = dtypes.get(dtype)
        if dt is None:
            dt = dtypes[dtype] = getattr(torch, dtype)
        out.append(torch.empty(0, dtype=dt).set_(storages[gi], soff, shape, stride))
    return out
