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

__all__ = ["deliver", "install", "relayed"]


class _CommsOfThisProcess:
    """A worker's comms, one set per process: where their messages go and whose they are
    (``install``), the comm class (made then: ``comm`` is imported only by a worker that uses
    widgets), and the frontend's messages waiting for the handler thread (started by the
    first ``deliver``; it serves the process for its life, as the reader thread does)."""

    def __init__(self) -> None:
        self.send: Callable[[Message], None] | None = None
        self.rank = -1
        self.comm_class: Any = None
        self.inbox: queue.Queue = queue.Queue()
        self.handler: threading.Thread | None = None


_COMMS_PER_PROCESS = _CommsOfThisProcess()


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
    send = _COMMS_PER_PROCESS.send
    if send is None:
        return
    try:
        send(msg)
    except OSError:  # closed (or blocked for long): as a kernel with no frontend
        pass


def _make_class() -> type:
    class ChannelComm(_base()):  # type: ignore[misc]
        """A comm whose peer is the notebook's frontend, reached through the notebook."""

        def publish_msg(self, msg_type: str, data: Any = None, metadata: Any = None,
                        buffers: Any = None, **keys: Any) -> None:
            data, metadata = _plain(data or {}), _plain(metadata or {})
            rank = _COMMS_PER_PROCESS.rank
            if msg_type == "comm_open":
                _post(CommOpen(rank, self.comm_id, keys.get("target_name") or
                               self.target_name, data, metadata, _bytes(buffers)))
            elif msg_type == "comm_msg":
                _post(CommMsg(rank, self.comm_id, data, metadata, _bytes(buffers)))
            elif msg_type == "comm_close":
                _post(CommClose(rank, self.comm_id, data))

        def handle_msg(self, msg: dict) -> None:
            """The frontend's message, without IPython's pre/post-execute events (a cell may
            be running on the main thread: its figures must not be flushed from here)."""
            if self._msg_callback is not None:
                self._msg_callback(msg)

    return ChannelComm


def install(send: Callable[[Message], None], rank: int) -> None:
    """In the worker: widgets made from now on open ``ChannelComm`` comms."""
    import comm

    here = _COMMS_PER_PROCESS
    here.send, here.rank = send, rank
    if here.comm_class is None:
        here.comm_class = _make_class()
    made = here.comm_class
    comm.create_comm = lambda *args, **kwargs: made(*args, **kwargs)


def relayed(comm_id: str) -> bool:
    """Whether ``comm_id`` is a comm of this worker that the notebook relays (a widget view
    with this model id can be shown there)."""
    made = _COMMS_PER_PROCESS.comm_class
    if made is None:
        return False
    import comm

    return isinstance(comm.get_comm_manager().comms.get(comm_id), made)


def deliver(msg: CommMsg | CommClose) -> None:
    """A message from the frontend for one of this worker's comms (from the reader thread)."""
    here = _COMMS_PER_PROCESS
    here.inbox.put(msg)
    if here.handler is None:
        here.handler = threading.Thread(target=_handle_loop, daemon=True, name="nbdist-comms")
        here.handler.start()


def _handle_loop() -> None:
    while True:
        msg = _COMMS_PER_PROCESS.inbox.get()
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
