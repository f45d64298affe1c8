"""The first minute and Ctrl-C, in real kernels: nbdist beside jupyter-distributed, 4 ranks.

``python bench/startup/first_minute.py`` (part of ``make bench``). Each round starts a fresh Jupyter
kernel per contender, the contenders taking turns (the order rotates), and drives it headless
through jupyter_client, as a notebook would, each cell sent the moment the last one replied:

- **nbdist** (and **nbdist, NBDIST_PREWARM=0**): ``%load_ext nbdist``, ``%dist_start 4``,
  ``%%dist`` ``1+1``, then ``%%dist`` with torch (``torch.ones(2).sum().item()``).
- **jupyter-distributed** 0.1.1: the kernel its Jupyter Server extension would start for a
  notebook set to 4 processes (``python -m jupyter_distributed.kernel``, world size 4, Python
  3 ranks, interrupts as messages: the launch its ``coordinator.py`` configures), then ``1+1``
  and the same torch cell. Its frontend (a tab per rank) needs a browser; its kernel does not.
  It is used where ``import jupyter_distributed`` works, or from ``NBDIST_BENCH_PEER_PATH``
  (``make bench`` puts it in ``.bench-peer/`` with ``pip install --target``: installed into
  the project's venv, its server extension would be switched on for every JupyterLab that
  venv starts, the browser tests' included, and would restart their kernels behind a proxy).

Figures, from ``start_kernel``: **first result**, the trivial cell's reply on 4 ranks; **torch
result**, the torch cell's reply. nbdist's ``%load_ext`` (its cell) and ``%dist_start 4``
(the cell, and the time its line says). Then **Ctrl-C**, ``--interrupts`` times per round:
a cell that prints ``asleep`` on every rank then sleeps 30 s is interrupted once all 4 said
so; the time from the interrupt to the kernel's idle status, and the lines the cell then
shows (nbdist: the error; jupyter-distributed: its per-rank text display).

Writes ``bench/results/first_minute.json`` and ``.md`` (the commit measured, the machine's
load). ``--smoke``: one round, one interrupt, a temporary directory. Every kernel and process
it starts is stopped at the end; exits non-zero on an error or a process left behind.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import queue
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this family's helpers, then bench/'s
sys.path.insert(0, str(HERE.parents[1] / "tests"))
import _common  # noqa: E402
from kernel_helpers import Kernel  # noqa: E402

RANKS = 4
PEER = "jupyter-distributed"
PEER_ENV = "NBDIST_BENCH_PEER_PATH"
TRIVIAL = "1+1"
TORCH = "import torch\ntorch.ones(2).sum().item()"
SLEEPER = ("import os, time\nopen(os.path.join({dir!r}, str(os.getpid())), 'w').close()\n"
           "print('asleep', flush=True)\ntime.sleep(30)")
READY_IN = re.compile(r"ranks ready in ([\d.]+)s")
TIMEOUT = 300.0


class Driven(Kernel):
    """A kernel driven headless, timed from ``start_kernel``; each cell timed to its idle."""

    def __init__(self, **kw: object) -> None:
        self.t0 = time.monotonic()
        super().__init__(**kw)  # type: ignore[arg-type]

    def since_start(self) -> float:
        return time.monotonic() - self.t0

    def timed(self, code: str, until=None) -> tuple[float, list[dict], str]:
        """Run ``code``; (seconds from sending it to its idle status, its iopub messages,
        the reply's status). ``until()`` True: interrupt it then, and time from there."""
        msg_id = self.kc.execute(code, stop_on_error=False)
        t = time.monotonic()
        msgs: list[dict] = []
        deadline = t + TIMEOUT
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"cell {code!r} still running after {TIMEOUT:.0f}s")
            if until is not None and until():
                until = None
                t = time.monotonic()
                self.km.interrupt_kernel()
            try:
                msg = self.kc.get_iopub_msg(timeout=0.005)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                took = time.monotonic() - t
                break
            msgs.append(msg)
        while True:
            reply = self.kc.get_shell_msg(timeout=TIMEOUT)
            if reply["parent_header"].get("msg_id") == msg_id:
                return took, msgs, reply["content"]["status"]


def _text(msgs: list[dict]) -> str:
    """What a cell showed as text: streams, errors, and the last text of each display."""
    out, displays = [], {}
    for m in msgs:
        kind, c = m["msg_type"], m["content"]
        if kind == "stream":
            out.append(c["text"])
        elif kind == "error":
            out.append("\n".join(c["traceback"]) + "\n")
        elif kind in ("display_data", "update_display_data", "execute_result"):
            key = c.get("transient", {}).get("display_id") or id(m)
            displays[key] = c.get("data", {}).get("text/plain", "")
    return "".join(out) + "\n".join(displays.values())


def _ok(status: str, what: str, msgs: list[dict]) -> None:
    if status != "ok":
        raise RuntimeError(f"{what} ended {status}:\n{_text(msgs)[-2000:]}")


def _interrupts(k: Driven, prefix: str, n: int) -> list[dict]:
    """Ctrl-C ``n`` times, each once every rank has begun to sleep (each leaves a file)."""
    rounds = []
    for _ in range(n):
        with tempfile.TemporaryDirectory(prefix="nbdist-bench-asleep-") as marks:
            took, msgs, status = k.timed(prefix + SLEEPER.format(dir=marks),
                                         until=lambda m=marks: len(os.listdir(m)) >= RANKS)
        if status == "ok":
            raise RuntimeError("the sleeping cell was not interrupted")
        shown = [ln for ln in _text(msgs).splitlines() if ln.strip()]
        rounds.append({"to_idle_s": took, "lines": len(shown) - RANKS})  # not the 'asleep's
    return rounds


def run_nbdist(env: dict[str, str], interrupts: int) -> dict:
    k = Driven(env=env)
    try:
        kernel = k.since_start()
        load, msgs, status = k.timed("%load_ext nbdist")
        _ok(status, "%load_ext", msgs)
        start, msgs, status = k.timed(f"%dist_start {RANKS}")
        _ok(status, "%dist_start", msgs)
        said = READY_IN.search(_text(msgs))
        _, msgs, status = k.timed("%%dist\n" + TRIVIAL)
        _ok(status, "the trivial cell", msgs)
        first = k.since_start()
        _, msgs, status = k.timed("%%dist\n" + TORCH)
        _ok(status, "the torch cell", msgs)
        torch_at = k.since_start()
        stops = _interrupts(k, "%%dist\n", interrupts)
        k.timed("%dist_stop")
        return {"kernel_s": kernel, "load_ext_s": load, "dist_start_s": start,
                "dist_start_said_s": float(said.group(1)) if said else None,
                "first_result_s": first, "torch_result_s": torch_at, "interrupts": stops}
    finally:
        k.close()


def run_peer(env: dict[str, str], interrupts: int, registry: Path) -> dict:
    argv = [sys.executable, "-m", "jupyter_distributed.kernel", "-f", "{connection_file}"]
    env = {**env, "JUPYTER_DISTRIBUTED_BASE_KERNEL": "python3",
           "JUPYTER_DISTRIBUTED_WORLD_SIZE": str(RANKS),
           "JUPYTER_DISTRIBUTED_REGISTRY_FILE": str(registry)}
    k = Driven(argv=argv, env=env, interrupt_mode="message")
    try:
        kernel = k.since_start()
        _, msgs, status = k.timed(TRIVIAL)  # the first cell starts the 4 rank kernels
        _ok(status, "the trivial cell", msgs)
        first = k.since_start()
        _, msgs, status = k.timed(TORCH)
        _ok(status, "the torch cell", msgs)
        torch_at = k.since_start()
        stops = _interrupts(k, "", interrupts)
        return {"kernel_s": kernel, "first_result_s": first, "torch_result_s": torch_at,
                "interrupts": stops}
    finally:
        k.close()


def _peer_path() -> str | None:
    """Where jupyter_distributed is importable from: "" (this Python), a directory, or None."""
    if importlib.util.find_spec("jupyter_distributed") is not None:
        return ""
    path = os.environ.get(PEER_ENV)
    if path and (Path(path) / "jupyter_distributed").is_dir():
        return path
    return None


def _median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarise(samples: dict[str, list[dict]]) -> dict:
    out = {}
    for name, runs in samples.items():
        stops = [s for r in runs for s in r["interrupts"]]
        row = {k: _median([r.get(k) for r in runs]) for k in (
            "kernel_s", "load_ext_s", "dist_start_s", "dist_start_said_s", "first_result_s",
            "torch_result_s")}
        row.update(interrupt_to_idle_s=_median([s["to_idle_s"] for s in stops]),
                   interrupt_to_idle_max_s=max((s["to_idle_s"] for s in stops), default=None),
                   interrupt_lines=_median([s["lines"] for s in stops]), runs=len(runs))
        out[name] = row
    return out


def _fmt(x: float | None, unit: str = "s", digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f} {unit}".rstrip()


def markdown(res: dict) -> str:
    meta, med = res["meta"], res["median"]
    names = list(med)
    lines = [f"# The first minute and Ctrl-C, {RANKS} ranks: nbdist beside {PEER}", "",
             f"At commit {meta['commit']}, {meta['when']}, {meta['cores']} cores, torch "
             f"{meta['torch']}, load average {meta['load_start']} at the start and "
             f"{meta['load_end']} at the end (other work shared the machine). {meta['rounds']} "
             f"rounds, contenders interleaved; medians. Rerun: "
             "`python bench/startup/first_minute.py`.",
             ""]
    if meta.get("peer") is None:
        lines += [f"{PEER} was not importable (`pip install --target DIR jupyter-distributed`,"
                  f" then `{PEER_ENV}=DIR`): nbdist alone.", ""]
    lines += ["| from `start_kernel` | " + " | ".join(names) + " |",
              "|---|" + "---|" * len(names)]
    rows = [("kernel ready", "kernel_s", "s"), ("`%load_ext nbdist` (the cell)", "load_ext_s",
                                                 "s"),
            ("`%dist_start 4` (the cell)", "dist_start_s", "s"),
            ("`%dist_start 4`: its line says", "dist_start_said_s", "s"),
            ("**first result on 4 ranks**", "first_result_s", "s"),
            ("torch result on 4 ranks", "torch_result_s", "s"),
            ("**Ctrl-C to idle** (median)", "interrupt_to_idle_s", "ms"),
            ("Ctrl-C to idle (worst)", "interrupt_to_idle_max_s", "ms"),
            ("lines Ctrl-C shows", "interrupt_lines", "")]
    for label, key, unit in rows:
        cells = []
        for n in names:
            v = med[n].get(key)
            if unit == "ms" and v is not None:
                cells.append(f"{v * 1000:.0f} ms")
            elif unit == "":
                cells.append("—" if v is None else f"{v:.0f}")
            else:
                cells.append(_fmt(v))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if PEER in med:
        lines += ["", f"Ratios, {PEER} / nbdist (medians): " + ", ".join(
            f"{label} {med[PEER][key] / med['nbdist'][key]:.2f}x" for label, key in (
                ("first result", "first_result_s"), ("torch result", "torch_result_s"),
                ("Ctrl-C to idle", "interrupt_to_idle_s"))
            if med[PEER].get(key) and med["nbdist"].get(key))]
    lines += ["", f"`import torch.distributed.rpc` in a fresh Python, measured at the end: "
              f"{_fmt(meta['import_torch_s'])}. nbdist's target: `%dist_start 4` right after "
              f"`%load_ext` ready within one such import plus 0.5 s; `%load_ext` <= 0.3 s and "
              f"Ctrl-C to idle <= 100 ms on an idle machine of this kind.", ""]
    return "\n".join(lines)


def _import_torch_s() -> float:
    import subprocess

    t = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch.distributed.rpc"], check=True,
                   timeout=TIMEOUT)
    return time.monotonic() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--interrupts", type=int, default=3, help="Ctrl-C per kernel and round")
    _common.add_arguments(ap)
    args = ap.parse_args(argv)
    rounds, interrupts = (1, 1) if args.smoke else (args.rounds, args.interrupts)
    out = _common.out_dir(args)
    import torch

    peer = _peer_path()
    meta = {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "cores": os.cpu_count(), "load_start": round(os.getloadavg()[0], 1),
            "torch": torch.__version__, "python": platform.python_version(),
            "commit": _common.measured_commit(), "smoke": args.smoke, "rounds": rounds,
            "peer": None if peer is None else "0.1.1"}
    base = {k: v for k, v in os.environ.items() if k not in ("NBDIST_PREWARM",
                                                              "NBDIST_TRACEBACK")}
    peer_env = dict(base)
    if peer:
        peer_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (peer, base.get("PYTHONPATH", "")) if p)
    contenders = {"nbdist": lambda: run_nbdist(base, interrupts),
                  "nbdist, NBDIST_PREWARM=0": lambda: run_nbdist(
                      {**base, "NBDIST_PREWARM": "0"}, interrupts)}
    failed = ""
    with tempfile.TemporaryDirectory(prefix="nbdist-bench-first-") as tmp:
        if peer is not None:
            contenders[PEER] = lambda: run_peer(peer_env, interrupts, Path(tmp) / "registry")
        samples: dict[str, list[dict]] = {n: [] for n in contenders}
        names = list(contenders)
        try:
            for r in range(rounds):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    samples[name].append(contenders[name]())
                    print(f"round {r + 1}/{rounds} {name}: {samples[name][-1]}", flush=True)
        except Exception as exc:  # noqa: BLE001 - reported, and the exit code says so
            failed = f"{type(exc).__name__}: {exc}"
            print(f"first_minute: {failed}", file=sys.stderr)
    left = [p for p in psutil.Process().children(recursive=True) if p.is_running()]
    for p in left:
        p.kill()
    meta.update(load_end=round(os.getloadavg()[0], 1), import_torch_s=_import_torch_s(),
                left_behind=len(left), failed=failed)
    res = {"meta": meta, "median": summarise({n: s for n, s in samples.items() if s}),
           "samples": samples}
    (out / "first_minute.json").write_text(json.dumps(res, indent=1) + "\n")
    md = markdown(res)
    (out / "first_minute.md").write_text(md)
    print(md)
    print(f"results in {out}", file=sys.stderr)
    if left:
        print(f"first_minute: {len(left)} processes were left behind", file=sys.stderr)
    return 1 if failed or left else 0


if __name__ == "__main__":
    sys.exit(main())
