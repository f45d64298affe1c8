"""One measurement of ``scale.py`` in a fresh process, printed as one JSON line.

``python _scale_child.py plain N TRANSPORTS``: plain torch, no nbdist: this process imports
torch, forks N-1 children, and every process calls ``init_rpc`` (``file://`` rendezvous, as
nbdist's local worlds); TRANSPORTS is ``default`` (torch's own choice) or ``uv`` (TCP only).
Reports the seconds from the first fork until rank 0's ``init_rpc`` returned and until an
``rpc_async`` was answered by every rank, rank 0's RSS
growth and the children's PSS, or the failure (rank 0's error, how many children failed).

``python _scale_child.py once N [HOSTS PER_HOST]``: ``nbdist.start(N - 1)`` (or across fake
hosts, as below), a cell on every rank, a view call, stop: whether it worked, and the seconds
of the start (``starts.py`` repeats it).

``python _scale_child.py nbdist N [HOSTS PER_HOST]``: ``nbdist.start(N - 1)`` (or, with HOSTS,
rank 0 alone here and HOSTS fake hosts of PER_HOST ranks each, ``tests/fakehosts.py``); then a
restart, a trivial cell, a view call, a print on every rank, ``%dist_status`` and the stop,
each timed, with the notebook's own CPU time and the control frames and bytes it sent for
each (its
``Channel``'s writes, counted by wrapping them here: nothing in nbdist is changed), rank 0's
RSS growth and each worker's PSS.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TIMEOUT = 600.0


def _rss_mb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _smaps_mb(pid: int, *fields: str) -> float | None:
    """The sum of ``fields`` (``Pss``, ``Private_Dirty``...) of ``pid``'s smaps_rollup, MB."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            kb = sum(int(line.split()[1]) for line in f if line.split(":")[0] in fields)
    except OSError:
        return None
    return kb / 1024


def _pss_mb(pid: int) -> float | None:
    return _smaps_mb(pid, "Pss")


def _uss_mb(pid: int) -> float | None:
    """What the process alone holds (its private pages): what one more rank costs."""
    return _smaps_mb(pid, "Private_Clean", "Private_Dirty")


def _spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    values = sorted(values)
    return {"min": round(values[0], 1), "median": round(statistics.median(values), 1),
            "max": round(values[-1], 1)}


def count_names(text: str) -> str:
    """``text`` with each ``[...]`` list of names replaced by how many it held (torch names
    every follower it waited for, in a different order each time)."""
    return re.sub(r"\[(?!\d+ names\])([^\]]*)\]",
                  lambda m: f"[{len(m.group(1).split(','))} names]", text)


def _short(exc: BaseException) -> str:
    """The first line of ``exc`` and its last (torch's cause), lists of names counted."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return count_names(text)[:300]


def plain(n: int, transports: str) -> dict[str, Any]:
    import torch.distributed.rpc as rpc

    tmp = tempfile.mkdtemp(prefix="nbdist-scale-plain-")
    init = f"file://{tmp}/rpc"
    more = {"_transports": ["uv"]} if transports == "uv" else {}

    def options() -> Any:
        return rpc.TensorPipeRpcBackendOptions(init_method=init, rpc_timeout=120, **more)

    read_end, write_end = os.pipe()
    before = _rss_mb()
    t0 = time.perf_counter()  # the forks count, as nbdist's start counts its own
    children = []
    for rank in range(1, n):
        pid = os.fork()
        if pid == 0:
            os.close(write_end)
            code = 0
            try:
                rpc.init_rpc(f"w{rank}", rank=rank, world_size=n, rpc_backend_options=options())
                os.read(read_end, 1)  # rank 0 has measured: leave without waiting for peers
                rpc.shutdown(graceful=False)
            except BaseException:  # noqa: BLE001 - counted, not shown
                code = 1
            os._exit(code)
        children.append(pid)
    os.close(read_end)
    out: dict[str, Any] = {"n": n, "who": f"plain torch ({transports})"}
    try:
        rpc.init_rpc("w0", rank=0, world_size=n, rpc_backend_options=options())
        out["start_s"] = round(time.perf_counter() - t0, 3)
        futs = [rpc.rpc_async(f"w{r}", os.getpid) for r in range(1, n)]
        for fut in futs:
            fut.wait()
        out["ready_s"] = round(time.perf_counter() - t0, 3)
        out["rank0_mb_per_peer"] = round((_rss_mb() - before) / max(n - 1, 1), 2)
        out["worker_pss_mb"] = _spread([p for p in map(_pss_mb, children) if p])
        out["worker_uss_mb"] = _spread([p for p in map(_uss_mb, children) if p])
        os.write(write_end, b"x" * len(children))
        rpc.shutdown(graceful=False)
    except Exception as exc:  # noqa: BLE001 - the failure is the measurement
        out["error"] = _short(exc)
        out["failed_after_s"] = round(time.perf_counter() - t0, 1)
    failed = 0
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            if "error" in out:
                os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        failed += status != 0 and "error" not in out
    out["children_failed"] = failed
    return out


class _Frames:
    """Counts the control frames (and bytes) this process writes, by wrapping the one method
    every ``Channel`` writes a frame with."""

    def __init__(self) -> None:
        from nbdist.control import channel

        self.frames = self.bytes = 0
        write = channel.Channel._write_frame

        def counted(chan: Any, payload: bytes) -> None:
            self.frames += 1
            self.bytes += len(payload)
            write(chan, payload)

        channel.Channel._write_frame = counted  # type: ignore[method-assign]

    def mark(self) -> tuple[int, int]:
        return self.frames, self.bytes

    def since(self, mark: tuple[int, int]) -> dict[str, int]:
        return {"frames": self.frames - mark[0], "bytes": self.bytes - mark[1]}


def _timed(out: dict, key: str, frames: _Frames, fn: Any) -> Any:
    mark = frames.mark()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    value = fn()
    out[f"{key}_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
    out[f"{key}_cpu_ms"] = round((time.process_time() - cpu0) * 1e3, 2)  # the notebook's own
    out[f"{key}_sent"] = frames.since(mark)
    return value


def _fake_hosts(hosts: int, per_host: int) -> tuple[Any, dict[str, Any]]:
    """``hosts`` fake hosts of ``per_host`` ranks (network namespaces, tests/fakehosts.py),
    or none, and the start's arguments for them; the caller closes the hosts."""
    kw: dict[str, Any] = {"start_timeout": TIMEOUT, "quiet": True}
    if not hosts:
        return None, kw
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from fakehosts import LAUNCHER, FakeHosts

    fake = FakeHosts([f"s{i}" for i in range(hosts)])
    kw.update(hosts={fake.ns[h]: per_host for h in fake.names}, iface=fake.address,
              launcher=LAUNCHER)
    return fake, kw


def world(n: int, hosts: int = 0, per_host: int = 0) -> dict[str, Any]:
    import torch  # noqa: F401 - paid before the start, as a notebook's first cells do

    import nbdist

    frames = _Frames()
    out: dict[str, Any] = {"n": n, "who": "nbdist" if not hosts else
                           f"nbdist, {hosts} hosts x {per_host}"}
    fake, kw = _fake_hosts(hosts, per_host)
    before = _rss_mb()
    c = None
    try:
        t0 = time.perf_counter()
        c = nbdist.start(0 if hosts else n - 1, **kw)
        out["start_s"] = round(time.perf_counter() - t0, 3)
        t0 = time.perf_counter()
        c = c.restart(quiet=True)
        out["restart_s"] = round(time.perf_counter() - t0, 3)
        for _ in range(3):  # warm: the first cells pay for imports
            c.run("x = 1", show=False)
        _timed(out, "cell", frames, lambda: c.run("x = 1", show=False))
        _timed(out, "view", frames, lambda: c[:].call(os.getpid))
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown):
            _timed(out, "print", frames, lambda: c.run("print('hello from', 'a rank')",
                                                       show=False))
        out["print_lines_shown"] = sum("hello from" in line
                                       for line in shown.getvalue().splitlines())
        _timed(out, "status", frames, lambda: c.status()._repr_html_())
        out["rank0_mb_per_peer"] = round((_rss_mb() - before) / max(n - 1, 1), 2)
        pids = [info.pid for r, info in c.ranks.items() if r and info.pid and not info.host]
        out["worker_pss_mb"] = _spread([p for p in map(_pss_mb, pids) if p])
        out["worker_uss_mb"] = _spread([p for p in map(_uss_mb, pids) if p])
        _timed(out, "stop", frames, c.stop)
        c = None
    finally:
        if c is not None:
            c.stop()
        if fake is not None:
            fake.close()
    return out


def once(n: int, hosts: int = 0, per_host: int = 0) -> dict[str, Any]:
    import torch  # noqa: F401 - paid before the start, as in ``world``

    import nbdist

    out: dict[str, Any] = {"n": n, "who": "nbdist" if not hosts else
                           f"nbdist, {hosts} hosts x {per_host}"}
    fake, kw = _fake_hosts(hosts, per_host)
    try:
        t0 = time.perf_counter()
        c = nbdist.start(0 if hosts else n - 1, **kw)
        try:
            out["start_s"] = round(time.perf_counter() - t0, 3)
            got = c.run("import os\nos.getpid()", show=False)
            want = {r: c.ranks[r].pid for r in range(1, n)}  # a host's rank: its own pid
            if {r: int(v) for r, v in got.items()} != want or c[:].call(os.getpid) != want:
                out["error"] = "a cell or a view call did not reach every rank"
        finally:
            t0 = time.perf_counter()
            c.stop()
            out["stop_s"] = round(time.perf_counter() - t0, 3)
    finally:
        if fake is not None:
            fake.close()
    return out


def main() -> None:
    what, n = sys.argv[1], int(sys.argv[2])
    if what == "plain":
        result = plain(n, sys.argv[3])
    else:
        hosts, per = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (0, 0)
        result = (once if what == "once" else world)(n, hosts, per)
    sys.stdout.flush()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
