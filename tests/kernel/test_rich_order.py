"""Issue 13, the rest: ranks' rich outputs that interleave within a ``%%dist`` cell end grouped
by rank; big bundles travel in ``DisplayChunk`` pieces and arrive whole; too big ones become a
note.

The kernel tests read every iopub message of a cell and replay them as a frontend does
(``display_data`` adds an output, ``update_display_data`` changes every output with that
display id), so they check what the cell finally shows. The order of arrival is made certain
by the test itself: a rank waits for a file the test writes once the iopub channel carried
the other rank's display.
"""

from __future__ import annotations

import base64
import itertools
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from kernel_helpers import kernel_with_world

from nbdist.control.protocol import DisplayChunk, DisplayData, ProtocolError, encode
from nbdist.output.rich_output import RichOutput

START = "%load_ext nbdist\n%dist_start 2\nimport nbdist"
PNG = b"\x89PNG\r\n\x1a\n"
WAIT = """
import os, time
from pathlib import Path
from IPython.display import HTML, display
r = int(os.environ['NBDIST_RANK'])
def wait(name):
    give_up = time.monotonic() + 60
    while not (Path({folder!r}) / name).exists():
        if time.monotonic() > give_up:
            raise TimeoutError(name)
        time.sleep(0.005)
"""


@pytest.fixture(scope="module")
def kernel():
    yield from kernel_with_world(START)


# -- helpers ----------------------------------------------------------------------------------


def _rank_of(content: dict) -> int | None:
    """The rank of a worker's display (not a label), else None."""
    tag = content.get("metadata", {}).get("nbdist", {})
    return None if tag.get("label") or "rank" not in tag else tag["rank"]


def _final(msgs: list[dict]) -> list[dict]:
    """The cell's outputs at its end, as a frontend shows them."""
    outputs: list[dict] = []
    for m in msgs:
        kind, content = m["msg_type"], m["content"]
        if kind in ("display_data", "execute_result"):
            outputs.append({"data": content["data"], "metadata": content["metadata"],
                            "id": content.get("transient", {}).get("display_id")})
        elif kind == "update_display_data":
            for out in outputs:
                if out["id"] == content["transient"]["display_id"]:
                    out["data"], out["metadata"] = content["data"], content["metadata"]
    return outputs


def _shown(outputs: list[dict]) -> list[tuple[str, str]]:
    """(kind, what) of each output: ("label", name) or (mime, content) of a rank's bundle."""
    shown = []
    for out in outputs:
        data, tag = out["data"], out["metadata"].get("nbdist", {})
        if tag.get("label"):
            shown.append(("label", data["text/plain"]))
        elif "image/png" in data:
            shown.append(("png", base64.b64decode(data["image/png"])[len(PNG):].decode()))
        elif "text/html" in data:
            shown.append(("html", data["text/html"]))
    return shown


def _stepper(folder: Path, steps: dict[tuple[int, int], str]) -> Callable[[dict], None]:
    """An ``on_message`` that writes file ``steps[(rank, n)]`` once the n-th display of
    ``rank`` (from 1) went by on iopub."""
    seen: dict[int, int] = {}

    def on_message(msg: dict) -> None:
        if msg["msg_type"] != "display_data":
            return
        rank = _rank_of(msg["content"])
        if rank is None:
            return
        seen[rank] = seen.get(rank, 0) + 1
        name = steps.get((rank, seen[rank]))
        if name:
            (folder / name).touch()

    return on_message


def _arrivals(msgs: list[dict]) -> list[int]:
    return [r for m in msgs if m["msg_type"] == "display_data"
            and (r := _rank_of(m["content"])) is not None]


# -- in a real kernel -------------------------------------------------------------------------
@pytest.mark.kernel
def test_interleaved_displays_end_grouped_by_rank(kernel, tmp_path):
    # worker1 png, worker2 png, worker1 html: they arrive so, and end worker1's then worker2's
    code = ("%%dist\n" + WAIT.format(folder=str(tmp_path)) +
            "if r == 1:\n"
            "    display({'image/png': b'\\x89PNG\\r\\n\\x1a\\n1a'}, raw=True)\n"
            "    wait('go-1b')\n"
            "    h = display(HTML('1b'), display_id=True)\n"
            "else:\n"
            "    wait('go-2')\n"
            "    display({'image/png': b'\\x89PNG\\r\\n\\x1a\\n2a'}, raw=True)\n")
    status, msgs = kernel.cell(code, _stepper(tmp_path, {(1, 1): "go-2", (2, 1): "go-1b"}))
    assert status == "ok", msgs
    assert _arrivals(msgs) == [1, 2, 1]  # they did interleave
    final = _final(msgs)
    assert _shown(final) == [("label", "[worker1]"), ("png", "1a"),
                             ("label", "[worker1]"), ("html", "1b"),
                             ("label", "[worker2]"), ("png", "2a")]
    assert [_rank_of(o) for o in final if _rank_of(o)] == [1, 1, 2]  # metadata moved along
    # only the two places that changed hands were rewritten: a label and a bundle each
    assert len([m for m in msgs if m["msg_type"] == "update_display_data"]) == 4

    # the worker's handle now updates the place where its output ended
    place = next(o["id"] for o in final if o["data"].get("text/html") == "1b")
    status, msgs = kernel.cell("%%dist --ranks 1\nh.update(HTML('1b, again'))")
    updates = [m["content"] for m in msgs if m["msg_type"] == "update_display_data"]
    assert status == "ok" and len(updates) == 1, msgs
    assert updates[0]["transient"]["display_id"] == place
    assert updates[0]["data"]["text/html"] == "1b, again"


@pytest.mark.kernel
def test_displays_that_did_not_interleave_stay_as_they_came(kernel, tmp_path):
    # worker2 first, then worker1 twice: not interleaved, so no message rewrites anything
    code = ("%%dist\n" + WAIT.format(folder=str(tmp_path)) +
            "if r == 1:\n"
            "    wait('go-1')\n"
            "    display(HTML('1a'))\n"
            "    display(HTML('1b'))\n"
            "else:\n"
            "    display(HTML('2a'))\n")
    status, msgs = kernel.cell(code, _stepper(tmp_path, {(2, 1): "go-1"}))
    assert status == "ok", msgs
    assert _arrivals(msgs) == [2, 1, 1]
    assert not [m for m in msgs if m["msg_type"] == "update_display_data"]
    assert [s for s in _shown(_final(msgs)) if s[0] == "html"] == [
        ("html", "2a"), ("html", "1a"), ("html", "1b")]


@pytest.mark.kernel
def test_a_big_bundle_arrives_whole_in_pieces_in_order_with_prints(kernel):
    before = kernel.value("nbdist.current().cells.rich.assembled")
    status, msgs = kernel.cell("%%dist --ranks 1\nimport random\n"
                                 "from IPython.display import display\n"
                                 "data = b'\\x89PNG\\r\\n\\x1a\\n' + "
                                 "random.Random(7).randbytes(3 << 20)\n"
                                 "print('before')\n"
                                 "display({'image/png': data, 'text/plain': 'big'}, raw=True)\n"
                                 "print('after')")
    assert status == "ok", [m for m in msgs if m["msg_type"] != "display_data"]
    assert kernel.value("nbdist.current().cells.rich.assembled") == before + 1  # in pieces
    kinds = []
    for m in msgs:
        if m["msg_type"] == "stream":
            kinds += [w for w in ("before", "after") if f"[worker1] {w}" in m["content"]["text"]]
        elif m["msg_type"] == "display_data" and "image/png" in m["content"]["data"]:
            kinds.append("png")
            png = base64.b64decode(m["content"]["data"]["image/png"])
            assert png == PNG + random.Random(7).randbytes(3 << 20)  # the same bytes
            assert m["content"]["metadata"]["nbdist"] == {"rank": 1, "name": "worker1"}
    assert kinds == ["before", "png", "after"]


@pytest.mark.kernel
def test_a_bundle_over_the_limit_becomes_a_note(kernel):
    status, msgs = kernel.cell("%%dist --ranks 2\nfrom IPython.display import display\n"
                                 "display({'image/png': bytes(11 << 20)}, raw=True)")
    assert status == "ok", msgs
    shown = [m["content"]["data"] for m in msgs if m["msg_type"] == "display_data"
             and _rank_of(m["content"]) == 2]
    assert len(shown) == 1 and "image/png" not in shown[0], shown
    assert shown[0]["text/plain"].startswith(
        "nbdist: a display of 14.7 MB from rank 2 (worker2) was not shown (limit 10 MB")


# -- in this process --------------------------------------------------------------------------
def _pieces(msg: DisplayData, size: int, bundle: int = 1) -> list[DisplayChunk]:
    payload = encode(msg)
    n = -(-len(payload) // size)
    return [DisplayChunk(msg.rank, bundle, i, n, payload[i * size:(i + 1) * size])
            for i in range(n)]


def test_pieces_join_into_the_display_and_out_of_step_ones_are_dropped():
    rich = RichOutput({})
    big = DisplayData(1, {"image/png": "A" * 5000, "text/plain": "x"}, {"a": 1}, "id", False, 3)
    pieces = _pieces(big, 1000)
    other = _pieces(DisplayData(1, {"text/plain": "y"}, {}), 5, bundle=2)
    assert len(other) > len(pieces) > 1
    got = []
    for mine, theirs in itertools.zip_longest(pieces, other):
        if mine is not None:
            got.append(rich.piece(1, mine))
        got.append(rich.piece(1, theirs))  # another thread of the rank displays meanwhile
    assert [g for g in got if g is not None] == [big, DisplayData(1, {"text/plain": "y"}, {})]
    assert rich.assembled == 2
    assert rich.piece(1, pieces[0]) is None
    with pytest.raises(ProtocolError):  # a piece missing: that display is dropped
        rich.piece(1, pieces[2])
    with pytest.raises(ProtocolError):  # ... and its later pieces with it
        rich.piece(1, pieces[3])
    assert not rich._pieces
    for k in range(20):  # displays interrupted after their first piece are not kept forever
        rich.piece(2, _pieces(big, 1000, bundle=k)[0])
    assert len(rich._pieces) == 8


def test_big_displays_travel_in_pieces_outside_jupyter(world, capsys):
    c = world(1)
    capsys.readouterr()
    c.run("from IPython.display import display\nprint('before')\n"
          "display({'image/png': bytes(1 << 20), 'text/plain': 'a big one'}, raw=True)\n"
          "print('after')")
    c.flush()
    out = capsys.readouterr().out
    assert c.cells.rich.assembled == 1
    assert out.index("[worker1] before") < out.index("[worker1] a big one") < \
        out.index("[worker1] after")
