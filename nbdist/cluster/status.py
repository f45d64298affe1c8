"""``%dist_status``: one row per rank, as a text table and as HTML in a notebook; past 16
ranks one line per host and state of alike ranks, the odd ones out first (``status_groups``).

CPU % and memory come from psutil: for local ranks sampled here, for ranks on other hosts
by their host's join agent, which sends them with each heartbeat (``remote_samples``).

The warm template process outlives worlds, so it gets a row too (rank ``-``, name
``template``) when its pid is passed to ``collect_status``. In a world on GPUs each rank's
device and torch's memory on it (allocated / reserved, asked of the rank by RPC; rank 0's only
if the notebook initialised CUDA itself) join the row, and the GPU's utilisation where NVML
(``pynvml``) is installed. Where large tensors travel through shared memory (``shm/transport``)
each local rank's arena shows as MB in use / faulted in (asked of the rank by RPC).
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass
from typing import Any

from ..proc.procstat import Sampler
from ..rank_sets import SMALL, spans
from ..table import html_table, text_table
from ..telemetry import tracing
from .status_groups import Line, group_rows

__all__ = ["HostTable", "StatusTable", "collect_status", "host_status", "remote_samples"]

_SAMPLER_PER_PROCESS = Sampler()  # local pids: the notebook's ranks and the template
_sample = _SAMPLER_PER_PROCESS.sample
TEMPLATE_RANK = "-"  # the template's row is not a rank of the world


def remote_samples(agents: dict[str, Any]) -> dict[int, tuple]:
    """``{rank: (pid, cpu %, memory MB)}`` of the ranks on other hosts, as each live join
    agent sampled them for its last heartbeat (at most a second old)."""
    out: dict[int, tuple] = {}
    for agent in agents.values():
        if agent.alive():
            for rank, pid, cpu, mem in agent.beat.ranks:
                out[rank] = (pid, cpu, mem)
    return out


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


@dataclass
class StatusTable:
    """Rows of ``rank, name, pid, state, cpu %, memory MB, uptime s`` (and ``host`` after
    ``name`` when the world spans hosts); ``HostTable`` is its one-line-per-host twin. Past
    ``small`` ranks it shows a line per host and state of alike ranks, odd ones first
    (``status_groups``); ``rows`` keeps every rank's."""

    rows: list[dict]
    with_host: bool = False
    with_gpu: bool = False
    with_shm: bool = False
    world: str = ""  # the world's state (``ClusterState``'s value): a line below the rows
    small: int = SMALL  # past this many workers, alike ranks share a line (``status_groups``)

    COLUMNS = ("rank", "name", "pid", "state", "cpu %", "mem MB", "uptime s")
    GROUP_COLUMNS = ("ranks", "names", "n", "pid", "state", "cpu %", "mem MB", "uptime s")
    GPU_COLUMNS = ("gpu", "gpu MB alloc/res", "gpu util %")

    @property
    def columns(self) -> tuple[str, ...]:
        cols = self.COLUMNS
        if self.with_host:
            cols = (*cols[:2], "host", *cols[2:])
        cols = (*cols, *self.GPU_COLUMNS) if self.with_gpu else cols
        return (*cols, "shm MB used/faulted") if self.with_shm else cols

    def _cells(self, row: dict) -> list[str]:
        cells = [str(row["rank"]), row["name"], str(row["pid"] or "-"), row["state"],
                 _num(row["cpu"], ".0f"), _num(row["mem_mb"], ".0f"),
                 _num(row["uptime"], ".1f")]
        if self.with_host:
            cells.insert(2, row.get("host") or "local")
        if self.with_gpu:
            mem = row.get("gpu_mb")
            cells += [row.get("device") or "-",
                      "-" if mem is None else f"{mem[0]:.0f} / {mem[1]:.0f}",
                      _num(row.get("gpu_util"), ".0f")]
        if self.with_shm:
            u = row.get("shm")
            cells.append("-" if not u else f"{u['used'] / 2**20:.0f} / "
                                           f"{u['faulted'] / 2**20:.0f}")
        return cells

    @property
    def grouped(self) -> bool:
        """Whether the world is big enough (past ``small`` workers) to show grouped."""
        return sum(r["rank"] not in (0, TEMPLATE_RANK) for r in self.rows) > self.small

    @property
    def group_columns(self) -> tuple[str, ...]:
        cols = self.GROUP_COLUMNS
        if self.with_host:
            cols = (*cols[:2], "host", *cols[2:])
        cols = (*cols, "gpu MB alloc") if self.with_gpu else cols
        return (*cols, "shm MB used") if self.with_shm else cols

    def _group_cells(self, line: Line) -> list[str]:
        one = line.rows[0] if len(line.rows) == 1 else None
        cells = [line.ranks, line.names, str(len(line.rows)),
                 str(one["pid"] or "-") if one else "-", line.state,
                 line.values(lambda r: r["cpu"], ".0f"), line.values(lambda r: r["mem_mb"], ".0f"),
                 line.values(lambda r: r["uptime"], ".1f")]
        if self.with_host:
            cells.insert(2, line.rows[0].get("host") or "local")
        if self.with_gpu:
            cells.append(line.values(lambda r: (r.get("gpu_mb") or (None,))[0], ".0f"))
        if self.with_shm:
            cells.append(line.values(lambda r: r["shm"]["used"] / 2**20 if r.get("shm")
                                     else None, ".0f"))
        return cells

    def _table(self) -> tuple[tuple[str, ...], list[list[str]], list[bool]]:
        """Columns, cells and whether each line's ranks are alive: a row per rank, or past
        ``small`` ranks a line per group (``status_groups``)."""
        if not self.grouped:
            return self.columns, [self._cells(r) for r in self.rows], \
                [r["alive"] for r in self.rows]
        lines = group_rows(self.rows, self.small)
        return self.group_columns, [self._group_cells(line) for line in lines], \
            [all(r["alive"] for r in line.rows) for line in lines]

    def __str__(self) -> str:
        tail = f"\nworld: {self.world}" if self.world else ""
        columns, cells, _ = self._table()
        return text_table(columns, cells) + tail

    __repr__ = __str__

    def _repr_html_(self) -> str:
        tail = f"<p>world: {self.world}</p>" if self.world else ""
        columns, cells, alive = self._table()
        return html_table("nbdist-status", columns, cells,
                          ["" if a else ' style="color:#b00"' for a in alive]) + tail

    def alive(self) -> dict[int, bool]:
        """``{rank: alive}`` for the world's ranks (the template row is not one)."""
        return {r["rank"]: r["alive"] for r in self.rows if r["rank"] != TEMPLATE_RANK}


def _template_row(pid: int, now: float) -> dict:
    """The warm template process: alive or gone, its CPU, memory and age."""
    cpu, mem = _sample(pid)
    alive = mem is not None
    uptime = None
    if alive:
        try:
            import psutil

            uptime = now - psutil.Process(pid).create_time()
        except Exception:
            uptime = None
    return {"rank": TEMPLATE_RANK, "name": "template", "pid": pid, "alive": alive,
            "state": "warm template" if alive else "gone", "cpu": cpu, "mem_mb": mem,
            "uptime": uptime, "exit_code": None}


def collect_status(cluster: Any, template_pid: int | None = None,
                   remote: dict[int, tuple] | None = None) -> StatusTable:
    """One row per rank of ``cluster``, then the template's row if ``template_pid`` is given.
    ``remote``: CPU and memory of ranks on other hosts (``remote_samples``)."""
    now = time.time()
    rows = []
    for rank in sorted(cluster.ranks):
        info = cluster.ranks[rank]
        alive = info.alive and (rank == 0 or cluster.state.live)
        cpu = mem = None
        if alive and info.host is None:
            cpu, mem = _sample(info.pid)
        elif alive:  # its pid means nothing here: its host's agent sampled it
            pid, rcpu, rmem = (remote or {}).get(rank, (None, None, None))
            if pid == info.pid:  # not a process this rank had before a restart
                cpu, mem = rcpu, rmem
        if rank == 0:
            state = "notebook"
        elif alive:
            state = "alive" if info.ready else "starting"
        else:
            state = info.reason() if info.exit_code is not None else "stopped"
        rows.append({"rank": rank, "name": info.name, "pid": info.pid, "alive": alive,
                     "state": state, "cpu": cpu, "mem_mb": mem,
                     "uptime": now - info.started if alive else None,
                     "exit_code": info.exit_code, "host": info.host})
    if template_pid is not None:
        rows.append(_template_row(template_pid, now))
    with_gpu = any(getattr(cluster.ranks[r], "device", None) for r in cluster.ranks)
    if with_gpu:
        _gpu_columns(cluster, rows)
    with_shm = cluster.running and getattr(cluster.spec, "rpc", False) and \
        _shm_column(cluster, rows)
    return StatusTable(rows, with_host=bool(getattr(cluster.spec, "hosts", ())),
                       with_gpu=with_gpu, with_shm=with_shm, world=cluster.state.value)


def _gpu_columns(cluster: Any, rows: list[dict], timeout: float = 2.0) -> None:
    """Each rank's device, its torch memory there (by RPC, all ranks at once) and the GPU's
    utilisation (NVML, if installed)."""
    from ..proc import cuda

    wanted = []
    for row in rows:
        info = cluster.ranks.get(row["rank"]) if row["rank"] != TEMPLATE_RANK else None
        dev = getattr(info, "device", None)
        row["device"] = dev
        if dev is None or not row["alive"]:
            continue
        row["gpu_util"] = cuda.utilisation(int(dev.split(":")[1]))
        wanted.append((row, info.name, (dev,)))
    _ask(wanted, cuda.memory, "gpu_mb", timeout)


def _shm_column(cluster: Any, rows: list[dict], timeout: float = 2.0) -> bool:
    """Each local rank's shared-memory arena in use / faulted in (MB); False when the path
    is off in this world."""
    from ..shm import transport as shm

    if shm.usage() is None:
        return False
    wanted = [(row, cluster.ranks[row["rank"]].name, ()) for row in rows
              if row["rank"] != TEMPLATE_RANK and row["alive"] and not row.get("host")]
    _ask(wanted, shm.usage, "shm", timeout)
    return True


def _ask(wanted: list[tuple[dict, str, tuple]], fn: Any, key: str, timeout: float) -> None:
    """``row[key] = fn(*args)`` on each row's rank: here for rank 0, by RPC for the others
    (all at once, each bounded by ``timeout``); None where a rank does not answer."""
    asked = []
    for row, name, args in wanted:
        if row["rank"] == 0:
            row[key] = fn(*args)
            continue
        try:
            import torch.distributed.rpc as rpc

            with tracing.paused():  # a status probe is not the user's RPC (dashboard panels)
                asked.append((row, rpc.rpc_async(name, fn, args=args, timeout=timeout)))
        except Exception:  # noqa: BLE001 - a status column, never an error
            row[key] = None
    deadline = time.monotonic() + timeout
    for row, fut in asked:
        while not fut.done() and time.monotonic() < deadline:
            time.sleep(0.005)
        try:
            row[key] = fut.value() if fut.done() else None
        except Exception:  # noqa: BLE001
            row[key] = None


@dataclass
class HostTable:
    """``%dist_status --hosts``: one row per host of the world."""

    rows: list[dict]
    note: str = ""  # a line above the table (the scheduler's job, its state, time left)

    COLUMNS = ("host", "agent pid", "ranks", "state", "load", "free MB")

    def _cells(self, row: dict) -> list[str]:
        return [row["host"], str(row["pid"] or "-"), row["ranks"], row["state"],
                _num(row["load"], ".2f"), _num(row["free_mb"], ".0f")]

    def __str__(self) -> str:
        table = text_table(self.COLUMNS, [self._cells(r) for r in self.rows])
        return f"{self.note}\n{table}" if self.note else table

    __repr__ = __str__

    def _repr_html_(self) -> str:
        table = html_table("nbdist-hosts", self.COLUMNS, [self._cells(r) for r in self.rows])
        return f"<p>{html.escape(self.note)}</p>{table}" if self.note else table


def host_status(cluster: Any, agents: dict[str, Any], note: str = "") -> HostTable:
    """One row per host in ``cluster``'s spec, from its agent (``hosts.host_agents.HostAgent``);
    ``note`` goes above the table."""
    rows = []
    for host, _ in cluster.spec.hosts:
        agent = agents.get(host)
        ranks = [r for r, i in cluster.ranks.items() if i.host == host]
        alive = agent is not None and agent.alive()
        state = "alive" if alive else f"lost ({agent.lost})" if agent and agent.lost else "gone"
        beat = agent.beat if alive else None
        rows.append({"host": host, "pid": agent.pid if agent else None,
                     "ranks": spans(ranks), "state": state,
                     "load": beat.load if beat else None,
                     "free_mb": beat.mem_mb if beat else None})
    return HostTable(rows, note)
