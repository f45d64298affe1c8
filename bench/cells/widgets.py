"""What a tab per rank and widgets from workers cost, in a real kernel (issue 37, items 5-6).

``python bench/cells/widgets.py`` (part of ``make bench``). One Jupyter kernel, ``%dist_start 2``.

After one cell of each kind (unmeasured: the first use imports ipywidgets), rounds:

1. **Output into tabs**: a cell in which both workers print ``LINES`` lines as fast as they
   can, as one stream and with ``--tabs``: seconds from sending the cell to the kernel going
   idle, and the iopub messages and bytes a frontend receives for it.
2. **A worker's widget**: a cell that sets an ``IntSlider``'s value ``UPDATES`` times, made
   and displayed on worker 1, and the same cell run in the notebook kernel itself: seconds
   to idle, and the ``comm_msg`` updates the frontend receives.

Writes ``bench/results/widgets.json`` and ``widgets.md`` (naming the commit measured).
``--smoke``: tiny counts, one round, a temporary directory. The kernel (and its world) is
always shut down.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import queue
import statistics
import sys
import time
from pathlib import Path

from jupyter_client.manager import KernelManager

_FAMILY = Path(__file__).resolve().parent
sys.path[:0] = [str(_FAMILY), str(_FAMILY.parent)]  # this family's helpers, then bench/'s
import _common  # noqa: E402

__all__ = ["main", "run_cell"]


def run_cell(kc, code: str, timeout: float = 600) -> tuple[float, list[dict]]:
    """(seconds from sending ``code`` to idle, the cell's iopub messages); raises on error."""
    t0 = time.perf_counter()
    msg_id = kc.execute(code)
    msgs = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the kernel did not finish the cell in {timeout}s: {code!r}")
        try:
            msg = kc.get_iopub_msg(timeout=min(left, 1.0))
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
        msgs.append(msg)
    seconds = time.perf_counter() - t0
    errors = [m["content"] for m in msgs if m["msg_type"] == "error"]
    if errors:
        raise RuntimeError(f"the cell failed: {errors[0]['ename']}: {errors[0]['evalue']}")
    return seconds, msgs


def _size(msgs: list[dict]) -> int:
    return sum(len(json.dumps(m["content"])) for m in msgs)


def _updates(msgs: list[dict]) -> int:
    return sum(1 for m in msgs if m["msg_type"] == "comm_msg"
               and "value" in m["content"]["data"].get("state", {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.add_arguments(ap)
    args = ap.parse_args()
    lines, updates, rounds = (200, 20, 1) if args.smoke else (20_000, 2_000, 4)
    out = _common.out_dir(args)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(_common.ROOT), *sys.path[1:]]))
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=env)
    kc = km.client()
    kc.start_channels()
    rows: dict[str, list] = {k: [] for k in ("flat", "tabs", "worker", "notebook")}
    try:
        kc.wait_for_ready(timeout=120)
        run_cell(kc, "%load_ext nbdist\n%dist_start 2")
        flood = f"for i in range({lines}):\n    print(f'line {{i}}')"
        slider = ("import ipywidgets as w\ns = w.IntSlider(max=10**9)\ndisplay(s)\n"
                  f"for i in range(1, {updates} + 1):\n    s.value = i")
        # not measured: the first use imports ipywidgets, in the kernel and on worker 1
        run_cell(kc, "%%dist --tabs\nprint('warm')")
        run_cell(kc, "%%dist --ranks 1\n" + slider.replace(str(updates), "1"))
        run_cell(kc, slider.replace(str(updates), "1"))
        for r in range(rounds):
            order = ("flat", "tabs") if r % 2 == 0 else ("tabs", "flat")
            for mode in order:
                head = "%%dist --tabs\n" if mode == "tabs" else "%%dist --no-tabs\n"
                seconds, msgs = run_cell(kc, head + flood)
                rows[mode].append({"seconds": seconds, "messages": len(msgs),
                                   "bytes": _size(msgs)})
            order = ("worker", "notebook") if r % 2 == 0 else ("notebook", "worker")
            for where in order:
                head = "%%dist --ranks 1\n" if where == "worker" else ""
                seconds, msgs = run_cell(kc, head + slider)
                rows[where].append({"seconds": seconds, "updates": _updates(msgs)})
        run_cell(kc, "%dist_stop")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)

    def med(mode: str, key: str) -> float:
        return statistics.median(row[key] for row in rows[mode])

    summary = {
        "commit": _common.measured_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "smoke": args.smoke, "lines_per_rank": lines, "updates": updates, "rounds": rounds,
        "rows": rows,
        "flood_seconds": {m: med(m, "seconds") for m in ("flat", "tabs")},
        "flood_messages": {m: med(m, "messages") for m in ("flat", "tabs")},
        "flood_bytes": {m: med(m, "bytes") for m in ("flat", "tabs")},
        "slider_seconds": {m: med(m, "seconds") for m in ("worker", "notebook")},
        "slider_updates": {m: med(m, "updates") for m in ("worker", "notebook")},
    }
    (out / "widgets.json").write_text(json.dumps(summary, indent=1))
    fs, fm, fb = summary["flood_seconds"], summary["flood_messages"], summary["flood_bytes"]
    ss, su = summary["slider_seconds"], summary["slider_updates"]
    md = [
        f"# A tab per rank and widgets from workers (commit {summary['commit']}, "
        f"{summary['machine']}, {summary['date']})",
        "",
        f"Medians of {rounds} interleaved rounds, one kernel, 2 workers; "
        "`python bench/cells/widgets.py`.",
        "",
        f"| 2 ranks print {lines:,} lines each | seconds to idle | iopub messages | "
        "iopub bytes |",
        "|---|---|---|---|",
        f"| one stream | {fs['flat']:.2f} | {fm['flat']:,.0f} | {fb['flat']:,.0f} |",
        f"| `--tabs` | {fs['tabs']:.2f} ({fs['tabs'] / fs['flat']:.2f}×) | "
        f"{fm['tabs']:,.0f} | {fb['tabs']:,.0f} |",
        "",
        f"| an IntSlider set {updates:,} times | seconds to idle | updates sent to the "
        "frontend |",
        "|---|---|---|",
        f"| in the notebook kernel | {ss['notebook']:.2f} | {su['notebook']:,.0f} |",
        f"| on worker 1 (relayed) | {ss['worker']:.2f} "
        f"({ss['worker'] / ss['notebook']:.2f}×) | {su['worker']:,.0f} |",
        "",
    ]
    (out / "widgets.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
