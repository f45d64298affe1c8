"""Widgets made on workers, in a real kernel: their comms reach the frontend (the iopub
messages a frontend would get), the frontend's messages reach the worker's widget, and a
reloaded page gets their state back over ipywidgets' control comm."""

from __future__ import annotations

import time

import pytest
from kernel_helpers import Kernel, kernel_with_world

START = "%load_ext nbdist\n%dist_start 2"
VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.fixture(scope="module")
def k():
    yield from kernel_with_world(START)


def _of(msgs: list[dict], kind: str) -> list[dict]:
    return [m for m in msgs if m["msg_type"] == kind]


def _send_comm(k: Kernel, kind: str, content: dict, metadata: dict | None = None) -> None:
    """What a frontend sends on the shell channel."""
    msg = k.kc.session.msg(kind, content, metadata=metadata or {})
    k.kc.shell_channel.send(msg)


def _slider(k: Kernel) -> tuple[str, list[dict]]:
    status, msgs = k.cell("%%dist --ranks 1\nimport ipywidgets as w\n"
                          "s = w.IntSlider(value=3, description='x')\ndisplay(s)\ns.value = 7")
    assert status == "ok", msgs
    opens = [m for m in _of(msgs, "comm_open")
             if m["content"]["data"]["state"]["_model_name"] == "IntSliderModel"]
    assert len(opens) == 1, [m["content"]["data"]["state"]["_model_name"]
                             for m in _of(msgs, "comm_open")]
    return opens[0]["content"]["comm_id"], msgs


def test_a_worker_widget_opens_a_real_comm_labelled_with_its_rank(k):
    comm_id, msgs = _slider(k)
    opened = next(m for m in _of(msgs, "comm_open") if m["content"]["comm_id"] == comm_id)
    assert opened["content"]["target_name"] == "jupyter.widget"
    assert opened["content"]["data"]["state"]["value"] == 3
    assert opened["metadata"]["nbdist"] == {"rank": 1, "name": "worker1"}
    assert opened["metadata"]["version"].startswith("2.")
    # every comm the slider needs (layout, style) was opened before its view is shown
    views = [m for m in _of(msgs, "display_data") if VIEW in m["content"]["data"]]
    assert [v["content"]["data"][VIEW]["model_id"] for v in views] == [comm_id]
    assert views[0]["content"]["metadata"]["nbdist"]["rank"] == 1
    assert msgs.index(opened) < msgs.index(views[0])
    label = msgs[msgs.index(views[0]) - 1]
    assert label["content"]["data"]["text/plain"] == "[worker1]"
    updates = [m["content"]["data"] for m in _of(msgs, "comm_msg")
               if m["content"]["comm_id"] == comm_id]
    assert {"method": "update", "state": {"value": 7}, "buffer_paths": []} in updates
    # the notebook kernel holds it as a comm of its own
    reply = k.kc.comm_info(target_name="jupyter.widget", reply=True, timeout=10)
    assert comm_id in reply["content"]["comms"]


def test_the_frontend_moves_a_worker_widget_and_a_reload_gets_its_state(k):
    comm_id, _ = _slider(k)
    _send_comm(k, "comm_msg", {"comm_id": comm_id, "data": {
        "method": "update", "state": {"value": 42}, "buffer_paths": []}})
    deadline = time.monotonic() + 20
    while True:  # the message reaches the worker's widget on a thread of its own
        rep = k.execute("%%dist --ranks 1\nprint(s.value)")
        if "[worker1] 42" in rep.stdout or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert "[worker1] 42" in rep.stdout, rep

    # a reloaded page: the control comm asks for every widget's state
    control = "control-" + comm_id
    _send_comm(k, "comm_open", {"comm_id": control, "target_name": "jupyter.widget.control",
                                "data": {}}, metadata={"version": "1.0.0"})
    msg = k.kc.session.msg("comm_msg", {"comm_id": control,
                                        "data": {"method": "request_states"}})
    k.kc.shell_channel.send(msg)
    deadline = time.monotonic() + 20
    states = None
    while states is None and time.monotonic() < deadline:
        m = k.kc.get_iopub_msg(timeout=5)
        if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == control:
            states = m["content"]["data"]["states"]
    assert states is not None, "no update_states on the control comm"
    assert states[comm_id]["model_name"] == "IntSliderModel"
    assert states[comm_id]["state"]["value"] == 42
    assert states[comm_id]["state"]["description"] == "x"


def test_a_worker_closing_its_widget_closes_the_comm(k):
    comm_id, _ = _slider(k)
    status, msgs = k.cell("%%dist --ranks 1\ns.close()")
    assert status == "ok"
    assert [m["content"]["comm_id"] for m in _of(msgs, "comm_close")] == [comm_id]
    reply = k.kc.comm_info(target_name="jupyter.widget", reply=True, timeout=10)
    assert comm_id not in reply["content"]["comms"]


def test_a_tqdm_notebook_bar_on_a_worker_moves_in_the_cell(k):
    status, msgs = k.cell("%%dist --ranks 2\nimport time\nfrom tqdm.notebook import tqdm\n"
                          "for i in tqdm(range(6), desc='epochs'):\n    time.sleep(0.12)")
    assert status == "ok", msgs
    models = {m["content"]["comm_id"]: m for m in _of(msgs, "comm_open")}
    bars = [cid for cid, m in models.items()
            if m["content"]["data"]["state"]["_model_name"] == "FloatProgressModel"]
    assert len(bars) == 1
    assert models[bars[0]]["metadata"]["nbdist"]["name"] == "worker2"
    values = [m["content"]["data"]["state"]["value"] for m in _of(msgs, "comm_msg")
              if m["content"]["comm_id"] == bars[0]
              and "value" in m["content"]["data"].get("state", {})]
    assert values == sorted(values) and values[-1] == 6 and len(set(values)) >= 2, values
    views = [m["content"]["data"][VIEW]["model_id"] for m in _of(msgs, "display_data")
             if VIEW in m["content"]["data"]]
    assert len(views) == 1 and models[views[0]]["content"]["data"]["state"]["_model_name"] \
        == "HBoxModel"
    assert not any("widgets live in the notebook" in m["content"].get("text", "")
                   for m in _of(msgs, "stream"))
