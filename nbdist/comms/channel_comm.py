"""Widgets on a worker: Jupyter comms that travel over the control channel.

A worker has no kernel, so ``install`` replaces ``comm.create_comm`` (the ``comm`` package's
seam) with ``ChannelComm``, whose open, msg and close become ``CommOpen``/``CommMsg``/
``CommClose`` messages; the notebook opens real comms under the same ids (``comms.relay``).
Frontend messages come back to ``deliver``, which runs the widget's handler on a thread of its
own (the reader stays free for Ctrl-C). Contract: comm messages are never dropped; a closed
channel drops them silently, as a kernel without a frontend does.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from ..control.protocol import CommClose, CommMsg, CommOpen, Message

__all__ = ["ChannelComm", "deliver", "install", "relayed"]

_send: Callable[[Message], None] | None = None
_rank = -1
_inbox: queue.Queue = queue.Queue()
_handler: threading.Thread | None = None


def _base() -> type:
    from comm.base_comm import BaseComm

    return BaseComm


def _plain(value: Any) -> Any:
    """JSON-like data as plain containers (tuples as lists, keys as str)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _bytes(buffers: Any) -> tuple:
    return tuple(bytes(b) for b in buffers or ())


def _post(msg: Message) -> None:
    if _send is None:
        return
    try:
        _send(msg)
    except OSError:  # closed (or blocked for long): as a kernel with no frontend
        pass


def _make_class() -> type:
    class ChannelComm(_base()):  # type: ignore[misc]
        """A comm whose peer is the notebook's frontend, reached through the notebook."""

        def publish_msg(self, msg_type: str, data: Any = None, metadata: Any = None,
                        buffers: Any = None, **keys: Any) -> None:
            data, metadata = _plain(data or {}), _plain(metadata or {})
            if msg_type == "comm_open":
                _post(CommOpen(_rank, self.comm_id, keys.get("target_name") or
                               self.target_name, data, metadata, _bytes(buffers)))
            elif msg_type == "comm_msg":
                _post(CommMsg(_rank, self.comm_id, data, metadata, _bytes(buffers)))
            elif msg_type == "comm_close":
                _post(CommClose(_rank, self.comm_id, data))

        def handle_msg(self, msg: dict) -> None:
            """The frontend's message, without IPython's pre/post-execute events (a cell may
            be running on the main thread: its figures must not be flushed from here)."""
            if self._msg_callback is not None:
                self._msg_callback(msg)

    return ChannelComm


ChannelComm: Any = None  # the class, made by ``install`` (``comm`` imported then)


def install(send: Callable[[Message], None], rank: int) -> None:
    """In the worker: widgets made from now on open ``ChannelComm`` comms."""
    global _send, _rank, ChannelComm
    import comm

    _send, _rank = send, rank
    if ChannelComm is None:
        ChannelComm = _make_class()
    comm.create_comm = lambda *args, **kwargs: ChannelComm(*args, **kwargs)


def relayed(comm_id: str) -> bool:
    """Whether ``comm_id`` is a comm of this worker that the notebook relays (a widget view
    with this model id can be shown there)."""
    if ChannelComm is None:
        return False
    import comm

    return isinstance(comm.get_comm_manager().comms.get(comm_id), ChannelComm)


def deliver(msg: CommMsg | CommClose) -> None:
    """A message from the frontend for one of this worker's comms (from the reader thread)."""
    global _handler
    _inbox.put(msg)
    if _handler is None:
        _handler = threading.Thread(target=_handle_loop, daemon=True, name="nbdist-comms")
        _handler.start()


def _handle_loop() -> None:
    while True:
        msg = _inbox.get()
        try:
            _handle(msg)
        except Exception as exc:  # noqa: BLE001 - a widget's callback failed: say so, go on
            import sys

            print(f"nbdist: a widget's handler failed: {exc!r}", file=sys.stderr)


def _handle(msg: CommMsg | CommClose) -> None:
    import comm

    target = comm.get_comm_manager().comms.get(msg.comm_id)
    if target is None:
        return
    if isinstance(msg, CommClose):
        target.handle_close({"content": {"comm_id": msg.comm_id, "data": msg.data}})
        comm.get_comm_manager().unregister_comm(target)
        return
    target.handle_msg({"content": {"comm_id": msg.comm_id, "data": msg.data},
                       "metadata": msg.metadata, "buffers": [memoryview(b) for b in msg.buffers]})
