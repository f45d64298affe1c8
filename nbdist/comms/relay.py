"""Workers' widgets in the notebook: their comms relayed to the notebook's frontend.

For a worker's ``CommOpen`` (``comms.channel_comm``), ``CommRelay`` opens a real comm in the
notebook kernel under the same id, so the frontend makes a real widget model; updates go on to the
frontend, the frontend's messages go back to the rank that owns the comm, closes go both ways.
Each relayed widget is entered in ipywidgets' registry as a ``WidgetMirror`` so a reloaded page
gets it back. Outside a Jupyter kernel comm messages are dropped.
docs/how-it-works.md, Module notes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..control.protocol import CommClose, CommMsg, CommOpen, Message
from ..output.router import in_jupyter

__all__ = ["CommRelay", "WidgetMirror"]

WIDGET_TARGET = "jupyter.widget"


def _registry() -> Any:
    """ipywidgets' registry of live widgets (model id -> widget): what its control comm
    answers a reloaded page from (``_instances`` in ipywidgets 8; None where it is not)."""
    try:
        from ipywidgets.widgets import widget
    except ImportError:
        return None
    return getattr(widget, "_instances", None)


class WidgetMirror:
    """A worker's widget as ipywidgets' registry sees it: its model names and its state."""

    def __init__(self, model_id: str, state: dict, close: Callable[[], None]) -> None:
        self.model_id, self.state, self._close = model_id, dict(state), close
        self._model_name = state.get("_model_name")
        self._model_module = state.get("_model_module")
        self._model_module_version = state.get("_model_module_version")

    def apply(self, data: dict, buffers: list) -> None:
        """Take the state carried by an ``update``/``echo_update`` message, either way."""
        if data.get("method") not in ("update", "echo_update") or \
                not isinstance(data.get("state"), dict):
            return
        state = dict(data["state"])
        _put_buffers(state, data.get("buffer_paths") or [], buffers)
        self.state.update(state)

    def get_state(self, key: Any = None, drop_defaults: bool = False) -> dict:
        if key is None:
            return dict(self.state)
        keys = [key] if isinstance(key, str) else list(key)
        return {k: self.state[k] for k in keys if k in self.state}

    def _get_embed_state(self, drop_defaults: bool = False) -> dict:
        from ipywidgets import Widget

        return Widget._get_embed_state(self, drop_defaults)  # type: ignore[arg-type]

    def close(self) -> None:
        self._close()


def _put_buffers(state: dict, paths: list, buffers: list) -> None:
    if paths:
        from ipywidgets.widgets.widget import _put_buffers as put

        put(state, paths, [memoryview(b) for b in buffers])


class CommRelay:
    """The notebook's end of the workers' widget comms (one per world). Thread-safe."""

    def __init__(self, send: Callable[[int, Message], bool]) -> None:
        """``send(rank, msg)``: to a worker; False when it is gone."""
        self._send = send
        self._lock = threading.Lock()
        self._comms: dict[str, tuple[int, Any]] = {}  # comm id -> (owning rank, the comm)
        self._mirrors: dict[str, WidgetMirror] = {}
        self.jupyter = in_jupyter()

    def opened(self, rank: int, name: str, msg: CommOpen) -> None:
        """Rank ``rank`` opened a comm: open its twin to the frontend."""
        if not self.jupyter:
            return
        import comm

        with self._lock:
            if msg.comm_id in self._comms:  # a worker may not take over another's comm
                return
            metadata = {**msg.metadata, "nbdist": {"rank": rank, "name": name}}
            twin = comm.create_comm(target_name=msg.target_name, data=msg.data,
                                    metadata=metadata, buffers=list(msg.buffers),
                                    comm_id=msg.comm_id)
            self._comms[msg.comm_id] = (rank, twin)
        twin.on_msg(lambda m, cid=msg.comm_id: self._from_frontend(cid, m))
        twin.on_close(lambda m, cid=msg.comm_id: self._closed_by_frontend(cid, m))
        state = msg.data.get("state")
        registry = _registry()
        if msg.target_name == WIDGET_TARGET and isinstance(state, dict) and registry is not None:
            mirror = WidgetMirror(msg.comm_id, state, lambda cid=msg.comm_id: self._close(cid))
            _put_buffers(mirror.state, msg.data.get("buffer_paths") or [], list(msg.buffers))
            with self._lock:
                self._mirrors[msg.comm_id] = mirror
            registry[msg.comm_id] = mirror

    def message(self, rank: int, msg: CommMsg) -> None:
        """A worker's widget sent a message: on to the frontend."""
        twin = self._twin(rank, msg.comm_id)
        if twin is None:
            return
        mirror = self._mirrors.get(msg.comm_id)
        if mirror is not None:
            mirror.apply(msg.data, list(msg.buffers))
        twin.send(data=msg.data, metadata=msg.metadata, buffers=list(msg.buffers))

    def closed(self, rank: int, msg: CommClose) -> None:
        """A worker's widget was closed: close its twin (its views go)."""
        if self._twin(rank, msg.comm_id) is not None:
            self._close(msg.comm_id, msg.data)

    def comm_ids(self, rank: int | None = None) -> list[str]:
        """The comms relayed now (of one rank, or all)."""
        with self._lock:
            return [cid for cid, (r, _) in self._comms.items() if rank is None or r == rank]

    def _twin(self, rank: int, comm_id: str) -> Any:
        with self._lock:
            owner, twin = self._comms.get(comm_id, (None, None))
        return twin if owner == rank else None

    def _forget(self, comm_id: str) -> tuple[int | None, Any]:
        """Drop a comm and its mirror; (its rank, its twin), Nones if it was not relayed."""
        with self._lock:
            rank, twin = self._comms.pop(comm_id, (None, None))
            self._mirrors.pop(comm_id, None)
        registry = _registry()
        if registry is not None and isinstance(registry.get(comm_id), WidgetMirror):
            registry.pop(comm_id, None)
        return rank, twin

    def _close(self, comm_id: str, data: dict | None = None) -> None:
        _, twin = self._forget(comm_id)
        if twin is not None:
            twin.close(data=data)

    def _from_frontend(self, comm_id: str, m: dict) -> None:
        with self._lock:
            rank, _ = self._comms.get(comm_id, (None, None))
        if rank is None:
            return
        content = m.get("content", {})
        data = content.get("data") or {}
        buffers = [bytes(b) for b in m.get("buffers") or ()]
        mirror = self._mirrors.get(comm_id)
        if mirror is not None:
            mirror.apply(data, buffers)
        self._send(rank, CommMsg(rank, comm_id, data, m.get("metadata") or {}, tuple(buffers)))

    def _closed_by_frontend(self, comm_id: str, m: dict) -> None:
        rank, _ = self._forget(comm_id)
        if rank is not None:
            data = m.get("content", {}).get("data") or {}
            self._send(rank, CommClose(rank, comm_id, data))
