"""Every message of the control plane, defined once, and the one place frames are coded.

A frame on the wire is a 4-byte big-endian length, then a pickle of ``(VERSION, tag, fields)``.
Decoding uses an unpickler that only builds plain data (str, bytes, numbers, tuples, lists,
dicts, sets) and nbdist's own classes, so a frame holding a class the receiver lacks, a
wrong version, an unknown tag or a damaged pickle is a ``ProtocolError`` for that one frame:
the reader reports it and goes on. A length over ``MAX_FRAME`` cannot be skipped safely and
is a ``FramingError``: the connection is closed.

Directions: W→N worker to notebook, N→W notebook to worker, N→T and T→N the notebook and the
warm template process, N→A and A→N the notebook and a join agent on another host.
"""

from __future__ import annotations

import io
import pickle
import struct
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from ..rank_config import RankConfig

__all__ = [
    "HEADER",
    "MAX_FRAME",
    "VERSION",
    "AgentReady",
    "ClearOutput",
    "Debug",
    "DebugEnd",
    "DebugInput",
    "DebugPrompt",
    "DisplayData",
    "Exec",
    "Exit",
    "Exited",
    "Failed",
    "Flush",
    "Flushed",
    "FramingError",
    "Heartbeat",
    "Hello",
    "Interrupt",
    "Kill",
    "Message",
    "Metrics",
    "Output",
    "ProtocolError",
    "Ready",
    "Rejoin",
    "Result",
    "Spawn",
    "Spawned",
    "Stop",
    "StoreOp",
    "StoreReply",
    "TemplateReady",
    "decode",
    "encode",
    "frame_length",
]

VERSION = 2  # 2: ``Spawn`` and ``Rejoin`` carry a ``RankConfig``, not a dict
HEADER = struct.Struct("!I")
MAX_FRAME = 256 << 20  # a length beyond this is taken as a broken stream, not a big message


class ProtocolError(ValueError):
    """One frame could not be decoded into a known message; the stream is still in step."""


class FramingError(ProtocolError):
    """The stream itself is broken (an impossible length): the connection must be closed."""


_TAGS: dict[str, type[Message]] = {}


class Message:
    """Base of every control message; ``TAG`` names it on the wire."""

    __slots__ = ()
    TAG: ClassVar[str] = ""


def _message(cls: type) -> type:
    """Make ``cls`` a frozen slotted dataclass and register its tag."""
    cls = dataclass(frozen=True, slots=True)(cls)
    if cls.TAG in _TAGS:
        raise TypeError(f"two control messages are tagged {cls.TAG!r}")
    _TAGS[cls.TAG] = cls
    return cls


# ---- worker -> notebook -----------------------------------------------------------------------
@_message
class Hello(Message):
    """W→N, first message on a new connection: which rank this is."""

    TAG: ClassVar[str] = "hello"
    rank: int
    pid: int


@_message
class Ready(Message):
    """W→N: the rank joined the RPC world (and process group) and serves requests."""

    TAG: ClassVar[str] = "ready"
    rank: int
    pid: int


@_message
class Failed(Message):
    """W→N: start-up failed; the formatted traceback. The worker exits after sending it."""

    TAG: ClassVar[str] = "failed"
    rank: int
    traceback: str


@_message
class Output(Message):
    """W→N: text the rank wrote to ``stream`` ("stdout" or "stderr"), any chunking."""

    TAG: ClassVar[str] = "out"
    rank: int
    stream: str
    text: str


@_message
class Metrics(Message):
    """W→N: one batch of ``nbdist.log`` records, ``(rank, name, rows, internal)``."""

    TAG: ClassVar[str] = "metrics"
    rank: int
    batch: tuple


@_message
class Result(Message):
    """W→N: a cell finished. ``status`` is "ok" (``value``: repr of the last expression or
    None) or "error" (``error_type``, ``error``, ``traceback``)."""

    TAG: ClassVar[str] = "result"
    rank: int
    exec_id: int
    status: str
    value: str | None = None
    error_type: str = ""
    error: str = ""
    traceback: str = ""


@_message
class DisplayData(Message):
    """W→N: a rich output (a mime bundle, binary values base64 text as in Jupyter) the rank
    displayed: ``display()``, a figure, an update of an earlier display with the same
    ``display_id`` (``update``), or a cell's last value (``result_of``: that cell's exec id)."""

    TAG: ClassVar[str] = "display"
    rank: int
    data: dict
    metadata: dict
    display_id: str | None = None
    update: bool = False
    result_of: int = 0


@_message
class ClearOutput(Message):
    """W→N: the rank called ``clear_output``: clear its own outputs in the running cell
    (``wait``: when its next output arrives)."""

    TAG: ClassVar[str] = "clear"
    rank: int
    wait: bool = False


@_message
class Flushed(Message):
    """W→N: everything printed or logged before the ``Flush(token)`` has been sent."""

    TAG: ClassVar[str] = "flushed"
    rank: int
    token: int


# ---- notebook -> worker -----------------------------------------------------------------------
@_message
class Exec(Message):
    """N→W: run ``code`` as a cell (``filename`` names it in tracebacks)."""

    TAG: ClassVar[str] = "exec"
    exec_id: int
    code: str
    filename: str


@_message
class Interrupt(Message):
    """N→W: raise KeyboardInterrupt in the running cell and in running RPC functions
    (``rpc_only``: in RPC functions alone, for an interrupted call that had not started)."""

    TAG: ClassVar[str] = "interrupt"
    rpc_only: bool = False


@_message
class Flush(Message):
    """N→W: send everything printed or logged so far, then ``Flushed(token)``."""

    TAG: ClassVar[str] = "flush"
    token: int


@_message
class Stop(Message):
    """N→W: flush and exit now."""

    TAG: ClassVar[str] = "stop"


@_message
class Rejoin(Message):
    """N→W: leave the current RPC world (and process group) and join the one ``config``
    (a ``RankConfig``) describes, keeping this process, its ``__main__`` and what it started
    with (``rank_config.STARTED_WITH``; ``%dist_restart --keep``); the worker answers
    ``Ready`` once it is in, or ``Failed`` and exits."""

    TAG: ClassVar[str] = "rejoin"
    config: RankConfig


# ---- debugging a rank -------------------------------------------------------------------------
@_message
class Debug(Message):
    """N→W: open a post-mortem session on the rank's last failure (runs as a cell, answered
    by a ``Result`` with this ``exec_id``)."""

    TAG: ClassVar[str] = "debug"
    exec_id: int


@_message
class DebugPrompt(Message):
    """W→N: a debugger on ``rank`` wrote ``text`` and waits for a line at ``prompt``.
    ``first``: the session just opened (a breakpoint asks whether anyone attends)."""

    TAG: ClassVar[str] = "debug-prompt"
    rank: int
    session: int
    text: str
    prompt: str
    first: bool = False


@_message
class DebugInput(Message):
    """N→W: the line typed for ``session``; None ends the session (quit)."""

    TAG: ClassVar[str] = "debug-input"
    session: int
    line: str | None


@_message
class DebugEnd(Message):
    """W→N: the session ended (``text``: what the debugger wrote last)."""

    TAG: ClassVar[str] = "debug-end"
    rank: int
    session: int
    text: str = ""


# ---- notebook <-> template --------------------------------------------------------------------
@_message
class TemplateReady(Message):
    """T→N: torch is imported; the template takes ``Spawn`` requests."""

    TAG: ClassVar[str] = "template-ready"
    pid: int


@_message
class Spawn(Message):
    """N→T: fork one worker with this configuration (a ``RankConfig``)."""

    TAG: ClassVar[str] = "spawn"
    config: RankConfig


@_message
class Spawned(Message):
    """T→N: the worker for ``rank`` is process ``pid``."""

    TAG: ClassVar[str] = "spawned"
    rank: int
    pid: int


@_message
class Exited(Message):
    """T→N: a worker ended; ``code`` as ``os.waitstatus_to_exitcode`` gives it."""

    TAG: ClassVar[str] = "exited"
    pid: int
    code: int


@_message
class Kill(Message):
    """N→T: send ``signal`` to these workers (only ones the template forked and has not reaped,
    so a reused pid is never signalled)."""

    TAG: ClassVar[str] = "kill"
    pids: tuple
    signal: int


@_message
class Exit(Message):
    """N→T: kill every worker, remove the runtime directory, exit."""

    TAG: ClassVar[str] = "exit"


# ---- notebook <-> join agent on another host (the template's remote twin; also takes the
# ---- template's Spawn, Spawned, Exited, Kill and Exit) --------------------------------------
@_message
class AgentReady(Message):
    """A→N: the agent for ``host`` imported torch; its ranks use ``iface`` (``address``)."""

    TAG: ClassVar[str] = "agent-ready"
    host: str
    pid: int
    hostname: str
    iface: str
    address: str


@_message
class Heartbeat(Message):
    """A↔N: still here (a link that went silent is a host lost, on either side). From an
    agent: the host's load and available memory, and ``ranks``, ``((rank, pid, cpu %,
    memory MB), ...)`` of the ranks it forked (None where a figure could not be read), for
    ``%dist_status``. ``ranks`` came last with a default, so a beat without it decodes."""

    TAG: ClassVar[str] = "heartbeat"
    load: float = 0.0
    mem_mb: float = 0.0
    ranks: tuple = ()


# ---- a rank <-> the notebook's rendezvous store (host worlds) -------------------------------
@_message
class StoreOp(Message):
    """R→N: one ``torch.distributed.Store`` operation on the world's rendezvous store."""

    TAG: ClassVar[str] = "store-op"
    op: str
    key: str = ""
    value: bytes = b""
    keys: tuple = ()
    number: int = 0
    timeout: float = 0.0


@_message
class StoreReply(Message):
    """N→R: the operation's result, or ``error`` (a timeout names the keys)."""

    TAG: ClassVar[str] = "store-reply"
    value: Any = None
    error: str = ""


# ---- coding -----------------------------------------------------------------------------------
_ALLOWED_BUILTINS = frozenset({"set", "frozenset", "complex", "slice", "range", "bytearray"})


class _PlainUnpickler(pickle.Unpickler):
    """Builds plain data and nbdist's own classes; anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module == "builtins" and name in _ALLOWED_BUILTINS) or module == "nbdist" or \
                module.startswith("nbdist."):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"the message holds a {module}.{name}, which the "
                                     "control channel does not carry")


_FIELDS_PER_PROCESS: dict[type, tuple[str, ...]] = {}


def encode(msg: Message) -> bytes:
    """The payload of one frame (without the length header)."""
    cls = type(msg)
    names = _FIELDS_PER_PROCESS.get(cls)
    if names is None:
        names = _FIELDS_PER_PROCESS[cls] = tuple(f.name for f in fields(cls))
    values = tuple(getattr(msg, n) for n in names)
    return pickle.dumps((VERSION, msg.TAG, values), protocol=pickle.HIGHEST_PROTOCOL)


def decode(payload: bytes) -> Message:
    """The message in one frame's payload; ``ProtocolError`` if it is not a known message."""
    try:
        obj = _PlainUnpickler(io.BytesIO(payload)).load()
    except Exception as exc:  # noqa: BLE001 - any damage to the pickle is the same to us
        raise ProtocolError(f"undecodable frame ({len(payload)} bytes): {exc}") from None
    if not (isinstance(obj, tuple) and len(obj) == 3):
        raise ProtocolError(f"a frame that is not a control message: {type(obj).__name__}")
    version, tag, values = obj
    if version != VERSION:
        raise ProtocolError(f"a control message of protocol version {version!r} (this side "
                            f"speaks {VERSION}); mixed nbdist versions?")
    cls = _TAGS.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise ProtocolError(f"an unknown control message {tag!r}")
    if not isinstance(values, tuple):
        raise ProtocolError(f"a {tag!r} message whose fields are not a tuple")
    try:
        return cls(*values)
    except TypeError as exc:
        raise ProtocolError(f"a {tag!r} message with the wrong fields: {exc}") from None


def frame_length(header: bytes) -> int:
    """The payload length a header announces; ``FramingError`` if it cannot be right."""
    (n,) = HEADER.unpack(header)
    if n > MAX_FRAME:
        raise FramingError(f"a frame header announcing {n} bytes (limit {MAX_FRAME}): "
                           "the stream is out of step")
    return n


# ---- big displays -----------------------------------------------------------------------------
@_message
class DisplayChunk(Message):
    """W→N: piece ``index`` of ``total`` of a big display: the pieces, joined, are the payload
    of one ``DisplayData`` frame (``encode``), which the notebook decodes and shows when the
    last piece arrives. Each piece is a whole frame of its own, so the rank's printed output
    and the other ranks' messages are not held up behind one huge frame."""

    TAG: ClassVar[str] = "display-chunk"
    rank: int
    bundle: int
    index: int
    total: int
    piece: bytes


__all__ += ["DisplayChunk"]


# ---- widgets made on a worker (their comms relayed to the notebook's frontend) --------------
@_message
class CommOpen(Message):
    """W→N: a widget on ``rank`` opened comm ``comm_id`` (Jupyter's ``comm_open``: the
    model's state in ``data``, binary parts in ``buffers``); the notebook opens a real comm
    to its frontend under the same id."""

    TAG: ClassVar[str] = "comm-open"
    rank: int
    comm_id: str
    target_name: str
    data: dict
    metadata: dict
    buffers: tuple = ()


@_message
class CommMsg(Message):
    """W→N and N→W: a ``comm_msg`` on comm ``comm_id`` of ``rank``'s widget: W→N from the
    widget to the frontend (a state update), N→W from the frontend to the widget (a slider
    moved, a request for its state)."""

    TAG: ClassVar[str] = "comm-msg"
    rank: int
    comm_id: str
    data: dict
    metadata: dict
    buffers: tuple = ()


@_message
class CommClose(Message):
    """W→N and N→W: comm ``comm_id`` of ``rank``'s widget closed (the widget was closed on
    the worker, or its view's model in the frontend)."""

    TAG: ClassVar[str] = "comm-close"
    rank: int
    comm_id: str
    data: dict


__all__ += ["CommClose", "CommMsg", "CommOpen"]


# ---- the relay: the notebook and the ranks of another host through that host's agent -------
@_message
class Relay(Message):
    """N→A: hand ``payload`` (one encoded N→W frame: ``Exec``, ``Interrupt``, ``Stop``) to
    each of ``ranks`` on the agent's host, as if the notebook had sent it to each: a cell to
    16 ranks of a host is one frame from the notebook, not 16."""

    TAG: ClassVar[str] = "relay"
    ranks: tuple
    payload: bytes


@_message
class Relayed(Message):
    """A→N: what the agent's ranks sent it within one relay window, in the order they sent
    it: ``entries``, ``((ranks, payload), ...)``, each payload one W→N frame as the rank
    encoded it; an ``Output`` several ranks sent alike comes once, with all their ranks
    (the frame names the first)."""

    TAG: ClassVar[str] = "relayed"
    entries: tuple


@_message
class Call(Message):
    """N→W: a view's call (``c[:].call``, ``push``, ``pull``) relayed to a host's ranks:
    ``payload`` is ``(fn, args, kwargs)`` pickled once with nbdist's shipping rules; the rank
    runs it as its RPC server runs a Python function (so it is interrupted, flushed and fails
    as any RPC function does) and answers ``Returned``; the notebook holds it to ``timeout``
    seconds."""

    TAG: ClassVar[str] = "call"
    call_id: int
    payload: bytes
    timeout: float


@_message
class Returned(Message):
    """W→N: a ``Call``'s end: ``status`` "ok" (``payload``: the value, pickled) or "error"
    (``error_type`` and ``error``: torch's text of the rank's exception, its traceback in)."""

    TAG: ClassVar[str] = "returned"
    rank: int
    call_id: int
    status: str
    payload: bytes = b""
    error_type: str = ""
    error: str = ""


__all__ += ["Call", "Relay", "Relayed", "Returned"]
