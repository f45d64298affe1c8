"""The control protocol and channel: bad frames cost one frame, strays never get in.

Real sockets throughout: channels over socketpairs and unix sockets, and a live world whose
workers (authenticated peers) send malformed, unknown and out-of-step frames.
"""

from __future__ import annotations

import os
import pickle
import socket
import threading
import time

import pytest

from nbdist.control import protocol
from nbdist.control.channel import Channel, HandshakeError, Listener, connect
from nbdist.control.protocol import (
    HEADER,
    MAX_FRAME,
    FramingError,
    Output,
    ProtocolError,
    Result,
    decode,
    encode,
)
from nbdist.errors import WorkerDiedError

SAMPLES = [
    protocol.Hello(1, 42), protocol.Ready(1, 42), protocol.Failed(2, "tb"),
    Output(1, "stdout", "hi\n"), protocol.Metrics(1, (1, "w1", [(0, 1.0, {"x": 1})], [])),
    Result(1, 7, "ok", "2"), Result(1, 8, "error", None, "ValueError", "bad", "tb"),
    protocol.Flushed(3, 9), protocol.Exec(4, "1+1", "<cell>"), protocol.Interrupt(),
    protocol.Flush(5), protocol.Stop(), protocol.TemplateReady(10), protocol.Spawn({"rank": 1}),
    protocol.Spawned(1, 11), protocol.Exited(11, -9), protocol.Kill((11, 12), 9), protocol.Exit(),
]


class WorkerOnly:
    """Stands for a class the notebook does not have (the decoder refuses any foreign class)."""


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: m.TAG)
def test_every_message_round_trips(msg):
    assert decode(encode(msg)) == msg


@pytest.mark.parametrize("payload, words", [
    (b"\x80\x05garbage", "undecodable"),
    (encode(Output(1, "stdout", "x"))[:-3], "undecodable"),  # truncated pickle
    (pickle.dumps((protocol.VERSION, "no-such-message", ())), "unknown control message"),
    (pickle.dumps((protocol.VERSION + 1, "stop", ())), "version"),
    (pickle.dumps((protocol.VERSION, "hello", (1,))), "wrong fields"),
    (pickle.dumps((protocol.VERSION, "out", (1, "stdout", WorkerOnly()))), "does not carry"),
    (pickle.dumps("just a string"), "not a control message"),
])
def test_bad_frames_are_protocol_errors(payload, words):
    with pytest.raises(ProtocolError, match=words):
        decode(payload)


def _pair() -> tuple[Channel, socket.socket]:
    a, b = socket.socketpair()
    return Channel(a, name="peer"), b


def _raw_frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


def test_channel_drops_bad_frames_and_reads_on():
    chan, raw = _pair()
    try:
        raw.sendall(_raw_frame(b"garbage") + _raw_frame(pickle.dumps((1, "nope", ())))
                    + _raw_frame(encode(Output(1, "stdout", "fine"))))
        for _ in range(2):
            with pytest.raises(ProtocolError):
                chan.recv(timeout=5)
        assert chan.recv(timeout=5) == Output(1, "stdout", "fine")
    finally:
        chan.close()
        raw.close()


def test_impossible_length_is_a_framing_error():
    chan, raw = _pair()
    try:
        raw.sendall(HEADER.pack(MAX_FRAME + 1))
        with pytest.raises(FramingError):
            chan.recv(timeout=5)
    finally:
        chan.close()
        raw.close()


def test_a_frame_cut_short_is_not_waited_for_forever(monkeypatch):
    from nbdist.control import channel as channel_mod

    monkeypatch.setattr(channel_mod, "FRAME_DEADLINE", 0.5)
    chan, raw = _pair()
    try:
        raw.sendall(HEADER.pack(100) + b"x" * 10)  # and then nothing
        t0 = time.monotonic()
        with pytest.raises(OSError, match="middle of a frame"):
            chan.recv(timeout=5)
        assert time.monotonic() - t0 < 5
    finally:
        chan.close()
        raw.close()


def test_sends_from_many_threads_arrive_whole_and_in_order_per_thread():
    chan, raw = _pair()
    reader = Channel(raw, name="reader")
    try:
        def blast(k: int) -> None:
            for i in range(300):
                chan.send(Output(k, "stdout", f"{k}:{i}:" + "y" * (i * 37 % 5000)))

        threads = [threading.Thread(target=blast, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        got: dict[int, list[int]] = {k: [] for k in range(4)}
        for _ in range(1200):
            msg = reader.recv(timeout=10)
            k, i, _ = msg.text.split(":", 2)
            got[int(k)].append(int(i))
        for t in threads:
            t.join(10)
        assert all(v == list(range(300)) for v in got.values())
        assert chan.drain(5)
    finally:
        chan.close()
        reader.close()


def test_listener_drops_strays_and_accepts_the_real_peer(tmp_path):
    key = os.urandom(32)
    path = str(tmp_path / "ctl")
    listener = Listener(path, key)
    strays = []
    try:
        wrong = socket.socket(socket.AF_UNIX)
        wrong.connect(path)
        strays.append(wrong)
        with pytest.raises(HandshakeError, match="without the world's key"):
            threading.Thread(target=lambda: (wrong.recv(32), wrong.sendall(b"\0" * 64)),
                             daemon=True).start()
            listener.accept(5, handshake_timeout=2)
        silent = socket.socket(socket.AF_UNIX)
        silent.connect(path)
        strays.append(silent)
        t0 = time.monotonic()
        with pytest.raises(HandshakeError, match="did not complete"):
            listener.accept(5, handshake_timeout=0.3)
        assert time.monotonic() - t0 < 3
        box: dict = {}
        t = threading.Thread(target=lambda: box.update(c=connect(path, key, timeout=5)))
        t.start()
        good = listener.accept(5)
        t.join(5)
        box["c"].send(Output(1, "stdout", "hello"))
        assert good.recv(timeout=5) == Output(1, "stdout", "hello")
        good.close()
        box["c"].close()
        assert len(listener.rejected) == 2
    finally:
        for s in strays:
            s.close()
        listener.close()


def test_a_worker_will_not_talk_to_a_notebook_without_the_key(tmp_path):
    path = str(tmp_path / "ctl")
    impostor = Listener(path, os.urandom(32))  # listens, but holds another key
    try:
        t = threading.Thread(target=lambda: pytest.raises(HandshakeError, impostor.accept, 5),
                             daemon=True)
        t.start()
        with pytest.raises((HandshakeError, OSError)):
            connect(path, os.urandom(32), timeout=5)
        t.join(5)
    finally:
        impostor.close()


INJECT = """
from nbdist.proc import worker
from nbdist.control import protocol
import pickle
chan = worker.current_channel()
for payload in PAYLOADS:
    chan.send_frame(payload)  # whole frames with bad contents
chan.drain(5)
'sent'
"""


def test_world_survives_bad_frames_from_an_authenticated_worker(world):
    c = world(2)
    bad = [b"garbage", pickle.dumps((protocol.VERSION, "nope", ())),
           pickle.dumps((protocol.VERSION + 1, "out", (1, "stdout", "x"))),
           encode(Output(1, "stdout", "whole\n"))[:-4]]
    c.run(f"PAYLOADS = {bad!r}", ranks=1, show=False)
    assert c.run(INJECT, ranks=1, show=False) == {1: "'sent'"}
    assert c.run("1+1", show=False) == {1: "2", 2: "2"}
    assert c.flush(5)
    assert c._receiver.dropped.get(1) == len(bad)
    # a worker-only class in a control message is dropped too, not fatal
    c.run("class OnlyHere: pass\nimport pickle\n"
          "PAYLOADS = [pickle.dumps((1, 'out', (1, 'stdout', OnlyHere())))]", ranks=1,
          show=False)
    c.run(INJECT, ranks=1, show=False)
    assert c.run("2+2", show=False) == {1: "4", 2: "4"}


def test_out_of_step_stream_closes_only_that_rank(world):
    c = world(2)
    code = ("from nbdist.proc import worker\nfrom nbdist.control import protocol\n"
            "chan = worker.current_channel()\nchan.drain(5)\n"
            "chan.sock.sendall(protocol.HEADER.pack(protocol.MAX_FRAME + 1))\n"
            "import time; time.sleep(5)")
    exec_id = c.send_cell(code, [2])
    with pytest.raises(WorkerDiedError):
        c.collect(exec_id, [2], timeout=30)
        c.run("1", ranks=2, show=False)
    assert c.run("3+3", ranks=1, show=False) == {1: "6"}
