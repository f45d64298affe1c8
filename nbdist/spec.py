"""The shape of a world, checked before anything starts: sizes, names, rank selections."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .devices import parse_gpus

__all__ = ["WorldSpec", "max_workers", "parse_hosts", "parse_ranks", "worker_names"]

_NAME = re.compile(r"^[A-Za-z0-9_:\-]{1,127}$")
_HOST = re.compile(r"^[A-Za-z0-9_.@\-]{1,253}$")
# A worker's own memory (private pages after the fork, RPC agent, threads) with room for its
# first cells; the measurement: bench/results/notes.md (an idle worker: 19 MB PSS).
WORKER_MB = 48
HARD_LIMIT = 256
AGGREGATE_FROM = 8  # workers from which equal lines of many ranks are merged by default
# Ranks up to which a world's RPC uses TensorPipe's shared-memory transport between local
# ranks (torch's default); above it, TCP on loopback (``WorldSpec.tp_transports``). The shm
# transport maps about 17 MB of ring buffers per peer in each process and its listener's
# backlog of 128 overflows when a big world's ranks all connect to rank 0 at once (plain
# torch's ``init_rpc`` fails at 64 ranks here); over TCP a peer costs under 0.5 MB and the
# kernel's accept queue, which rank 0 lengthens as it joins (``proc/backlog.py``), takes
# them all. Measured: bench/results/scale.md.
SHM_TRANSPORT_UP_TO = 16
TRANSPORTS = ("auto", "shm", "tcp")
# A start's deadline unless --start-timeout gives one: a base, and per rank what a rank's
# start costs on one core of an oversubscribed machine with room to spare (about 0.15 s of
# CPU a rank at 128 ranks, bench/results/scale.md), shared by this machine's cores.
START_SECONDS = 60.0
START_SECONDS_PER_RANK_CORE = 2.0


def _available_mb() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available / 2**20)
    except Exception:
        return 8192


def max_workers() -> int:
    """The most worker ranks this machine can hold right now, and never more than 256."""
    return max(1, min(HARD_LIMIT, (_available_mb() - 1024) // WORKER_MB))


@dataclass(frozen=True)
class WorldSpec:
    """Everything needed to start a world; ``validate`` says what is wrong in user terms."""

    n: int
    name: str = "worker0"
    worker_name: str = "worker{rank}"
    threads: int | None = None
    rpc_timeout: float = 60.0
    process_group: str | None = None
    start_timeout: float | None = None  # seconds; None: ``start_seconds`` sizes it
    env: dict = field(default_factory=dict, compare=False)
    hosts: tuple = ()  # ((host, ranks), ...): ranks after the local ones, in this order
    iface: str | None = None  # the notebook's interface or address that the hosts reach
    launcher: str = "ssh"  # ssh, srun, or a template with {host} and {command}
    remote_python: str | None = None  # the Python on the hosts (default: this one's path)
    gpus: str = "auto"  # auto, none, or GPU indices "0,2": rank r gets gpus[r % len] (devices)
    device_maps: str | None = None  # "auto": TensorPipe maps each rank's GPU to its peers'
    heal: bool = False  # replace a rank that dies, keeping the others (``cluster.heal``)
    rpc: bool = True  # False: no torch RPC agent on any rank, a process group instead
    aggregate: bool | str = "auto"  # equal lines of many ranks shown once (``aggregates``)
    slurm: str | None = None  # sbatch options: the hosts are the nodes of one allocation
    ray: str | None = None  # placement group options: the hosts are its bundles' nodes
    tabs: bool = False  # ``%%dist`` cells show a live tab per rank (``--tabs``)
    rpc_transport: str = "auto"  # TensorPipe between local ranks: shm, tcp, auto (by size)

    def __post_init__(self) -> None:
        # ``worker_name=["ps", "trainer{rank}"]`` from Python is the list ``ps,trainer{rank}``
        if isinstance(self.worker_name, (list, tuple)):
            object.__setattr__(self, "worker_name", ",".join(map(str, self.worker_name)))

    def validate(self) -> WorldSpec:
        n = self.n
        if isinstance(n, bool) or not isinstance(n, int):
            raise ValueError(f"the number of workers must be a whole number, got {n!r}; "
                             "for example `%dist_start 4`")
        self._validate_slurm()
        self._validate_hosts()
        if n < (0 if self.hosts or self.scheduled else 1):
            raise ValueError(f"the number of workers must be at least 1, got {n}; the notebook "
                             "is rank 0 and workers are ranks 1..N, e.g. `%dist_start 2`")
        limit = max_workers()
        if n > limit:
            avail = _available_mb()
            raise ValueError(
                f"{n} workers will not fit: each needs about {WORKER_MB} MB and this machine has "
                f"{avail / 1024:.1f} GiB available, so at most {limit} can start "
                f"(hard limit {HARD_LIMIT}). Ask for fewer, e.g. `%dist_start {min(limit, 4)}`")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise ValueError(f"--threads must be a positive whole number, got {self.threads!r}")
        if self.start_timeout is not None and (isinstance(self.start_timeout, bool) or not (
                isinstance(self.start_timeout, (int, float)) and self.start_timeout > 0)):
            raise ValueError(f"--start-timeout must be a positive number of seconds, "
                             f"got {self.start_timeout!r}")
        if not self.rpc_timeout > 0:
            raise ValueError(f"--rpc-timeout must be a positive number of seconds, "
                             f"got {self.rpc_timeout!r}")
        if not isinstance(self.rpc, bool):
            raise ValueError(f"rpc must be True or False, got {self.rpc!r}")
        if not isinstance(self.tabs, bool):
            raise ValueError(f"tabs must be True or False, got {self.tabs!r}")
        if self.rpc_transport not in TRANSPORTS:
            raise ValueError(f"--rpc-transport takes auto, shm or tcp, got "
                             f"{self.rpc_transport!r}")
        if self.aggregate not in (True, False, "auto"):
            raise ValueError(f"aggregate must be True, False or 'auto' (`--aggregate "
                             f"on|off|auto`), got {self.aggregate!r}")
        if self.process_group not in (None, "gloo", "nccl", "auto", "none"):
            raise ValueError(f"--process-group {self.process_group!r} is not supported; use "
                             "gloo (CPU collectives, DDP), nccl (a GPU per rank) or auto")
        parse_gpus(self.gpus)  # the flag's form; which GPUs exist is checked at start
        if self.device_maps not in (None, "auto", "none"):
            raise ValueError(f"--device-maps takes auto or none, got {self.device_maps!r}")
        names = self.names()
        for rank, nm in enumerate(names):
            if not _NAME.match(nm):
                raise ValueError(f"invalid name {nm!r} for rank {rank}: use letters, digits, "
                                 "'_', ':' or '-', at most 127 characters")
        seen: dict[str, int] = {}
        for rank, nm in enumerate(names):
            if nm in seen:
                raise ValueError(f"duplicate name {nm!r} (ranks {seen[nm]} and {rank}); every "
                                 "rank needs its own name: put {rank} in --worker-name, e.g. "
                                 "`--worker-name obs{rank}`")
            seen[nm] = rank
        return self

    def _validate_slurm(self) -> None:
        if self.slurm is not None and self.ray is not None:
            raise ValueError("--slurm and --ray both ask a scheduler for the nodes: give one")
        if self.slurm is not None and (not isinstance(self.slurm, str)
                                       or not self.slurm.strip()):
            raise ValueError("--slurm takes the allocation's sbatch options as one string, e.g. "
                             "--slurm \"-N 2 --ntasks-per-node=2 -t 30\"")
        if self.ray is not None and not isinstance(self.ray, str):
            raise ValueError("--ray takes the placement group's options as one string, e.g. "
                             "--ray \"--nodes 2 --ranks-per-node 2 --cpus 2\"")

    @property
    def scheduled(self) -> str | None:
        """Which scheduler gives the hosts (``"slurm"``, ``"ray"``), None when none does."""
        return "slurm" if self.slurm is not None else "ray" if self.ray is not None else None

    @property
    def scheduler_options(self) -> str | None:
        """The options given to that scheduler (``--slurm``'s or ``--ray``'s)."""
        return self.slurm if self.slurm is not None else self.ray

    def _validate_hosts(self) -> None:
        if not self.hosts:
            return
        for host, count in self.hosts:
            if not isinstance(host, str) or not _HOST.match(host):
                raise ValueError(f"invalid host {host!r} in --hosts: write HOST:K[,HOST:K...], "
                                 "e.g. `--hosts node1:4,node2:4`")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"host {host!r} needs at least one rank, got {count!r}")
        if len({h for h, _ in self.hosts}) != len(self.hosts):
            raise ValueError("a host is named twice in --hosts; give each host once with its "
                             "count, e.g. `--hosts node1:4`")
        if not self.iface:
            raise ValueError("--hosts needs --iface: the notebook's interface or address that "
                             "the hosts reach (nbdist never guesses, never listens on all "
                             "interfaces), e.g. `--iface eth0` or `--iface 10.0.0.5`")

    def placement(self) -> list[str | None]:
        """The host of each rank: None for the notebook's machine."""
        return [None] * (self.n + 1) + [h for h, k in self.hosts for _ in range(k)]

    def names(self) -> list[str]:
        """Rank 0's name, then each worker's, from ``worker_name`` (see ``worker_names``)."""
        return [self.name, *worker_names(self.worker_name, self.world_size - 1, self.name)]

    def with_changes(self, **changes) -> WorldSpec:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    @property
    def group_backend(self) -> str | None:
        """The process group to start: ``process_group``, or gloo in a world without RPC
        (the group is then what holds the world together); ``"none"``: no group (a bare
        world: neither RPC nor a group, as a spawned process starts)."""
        if self.process_group == "none":
            return None
        return self.process_group or (None if self.rpc else "gloo")

    @property
    def world_size(self) -> int:
        return self.n + 1 + sum(k for _, k in self.hosts)

    def aggregates(self) -> bool:
        """Whether equal lines printed by several ranks at once are shown once: ``aggregate``,
        or with "auto" ``NBDIST_AGGREGATE`` (1 or 0) if set, else from ``AGGREGATE_FROM``
        workers on."""
        if self.aggregate != "auto":
            return bool(self.aggregate)
        env = os.environ.get("NBDIST_AGGREGATE", "").strip().lower()
        if env in ("1", "on", "true", "yes"):
            return True
        if env in ("0", "off", "false", "no"):
            return False
        return self.world_size - 1 >= AGGREGATE_FROM

    def start_seconds(self) -> float:
        """How long a start may take before it fails naming the ranks it waited for:
        ``start_timeout``, else ``START_SECONDS`` plus ``START_SECONDS_PER_RANK_CORE`` a
        rank over this machine's cores (60 s for a few ranks; 256 ranks on 2 cores: 316 s)."""
        if self.start_timeout is not None:
            return float(self.start_timeout)
        cores = max(os.cpu_count() or 1, 1)
        return START_SECONDS + START_SECONDS_PER_RANK_CORE * self.world_size / cores

    def tp_transports(self) -> list[str] | None:
        """TensorPipe's transports for this world's RPC (the same on every rank): None for
        torch's own choice (shared memory between local ranks, TCP between hosts), or
        ``["uv"]`` (TCP only) with ``--rpc-transport tcp``, and with "auto" for a world of
        more than ``SHM_TRANSPORT_UP_TO`` ranks."""
        if self.rpc_transport == "tcp" or (self.rpc_transport == "auto"
                                           and self.world_size > SHM_TRANSPORT_UP_TO):
            return ["uv"]
        return None

    def thread_count(self) -> int:
        if self.threads is not None:
            return self.threads
        return max(1, (os.cpu_count() or 1) // (self.n + 1))


def worker_names(spec: str, count: int, notebook: str = "worker0") -> list[str]:
    """The names of workers 1..``count`` from ``--worker-name``: a pattern (``obs{rank}``), a
    fixed name (one worker only), or a comma list of roles whose last entry may hold
    ``{rank}`` and then names every rank the fixed entries leave (``ps,trainer{rank}``: rank 1
    ``ps``, ranks 2.. ``trainer2``, ...). ``notebook`` is rank 0's name, which no worker may
    take. Raises ValueError in the flag's terms."""
    if not isinstance(spec, str):
        raise ValueError(f"--worker-name must be a name pattern such as 'obs{{rank}}' or a list "
                         f"such as 'ps,trainer{{rank}}', got {spec!r}")
    entries = [e.strip() for e in spec.split(",")]
    if "" in entries:
        raise ValueError(f"--worker-name {spec!r} has an empty entry; write names separated by "
                         "single commas, e.g. `--worker-name ps,trainer{rank}`")
    *fixed, last = entries
    for e in fixed:
        if "{" in e or "}" in e:
            raise ValueError(f"--worker-name {spec!r}: only the last entry may be a pattern, "
                             f"{e!r} is not last; e.g. `--worker-name ps,trainer{{rank}}`")
    pattern = last if ("{" in last or "}" in last) else None
    if pattern is None:
        fixed.append(last)
    dup = next((e for i, e in enumerate(fixed) if e in fixed[:i]), None)
    if dup is not None:
        raise ValueError(f"--worker-name {spec!r} names {dup!r} twice; every rank needs its own "
                         "name")
    if notebook in fixed:
        raise ValueError(f"--worker-name {spec!r} gives a worker the notebook's name {notebook!r} "
                         "(rank 0, `--name`); choose another")
    if len(fixed) > count:
        raise ValueError(f"--worker-name {spec!r} has {len(fixed)} fixed names but this world "
                         f"has {count} worker{'s' if count != 1 else ''}; give at most {count}"
                         + (f" and end with a pattern for the rest, e.g. `{fixed[0]},w{{rank}}`"
                            if pattern is None else ""))
    if pattern is None and len(fixed) < count:
        if len(fixed) == 1:
            raise ValueError(f"--worker-name {spec!r} has no {{rank}}, so {count} workers would "
                             "share one name; use e.g. `--worker-name obs{rank}` (a fixed name "
                             "is fine with one worker), or a list of roles ending in a pattern, "
                             f"e.g. `--worker-name {spec},trainer{{rank}}`")
        left = (f"rank {count}" if len(fixed) + 1 == count
                else f"ranks {len(fixed) + 1}..{count}")
        raise ValueError(f"--worker-name {spec!r} names {len(fixed)} of {count} workers and has "
                         f"no {{rank}} entry for {left}; end the list with a pattern, e.g. "
                         f"`--worker-name {spec},w{{rank}}`")
    names = list(fixed)
    if pattern is not None:
        try:
            names += [pattern.format(rank=r) for r in range(len(fixed) + 1, count + 1)]
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"--worker-name {pattern!r} is not a valid pattern ({exc}); the only "
                             "field is {rank}, e.g. `obs{rank}`") from None
        if "{rank" not in pattern and count - len(fixed) > 1:
            raise ValueError(f"--worker-name {spec!r}: the last entry {pattern!r} has no {{rank}}, "
                             "so the remaining workers would share one name")
    return names


def parse_ranks(spec: str | int | list | tuple | None, names: list[str]) -> list[int]:
    """``"1,3"``, ``"1-3"``, ``"obs2"``, ``[1, 2]`` or None (all workers) -> sorted ranks."""
    workers = list(range(1, len(names)))
    if spec is None:
        return workers
    items: list = list(spec) if isinstance(spec, (list, tuple, set)) else [spec]
    parts: list[str] = []
    for it in items:
        parts.extend(str(it).split(","))
    by_name = {nm: r for r, nm in enumerate(names)}
    chosen: set[int] = set()
    for raw in parts:
        tok = raw.strip()
        if not tok:
            continue
        if tok in by_name:
            chosen.add(by_name[tok])
            continue
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", tok)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo > hi:
                raise ValueError(f"rank range {tok!r} runs backwards; write it low-high")
            rng = range(lo, hi + 1)
        elif tok.isdigit():
            rng = range(int(tok), int(tok) + 1)
        else:
            raise ValueError(f"unknown rank or name {tok!r}; this world has "
                             f"{', '.join(f'{r}={nm}' for r, nm in enumerate(names))}")
        for r in rng:
            if r == 0:
                raise ValueError("rank 0 is the notebook itself; run the cell normally, or use "
                                 "`%%dist --local` to run it on the notebook and workers together")
            if r >= len(names):
                raise ValueError(f"no rank {r}: this world has workers 1..{len(names) - 1}")
            chosen.add(r)
    if not chosen:
        raise ValueError(f"--ranks {spec!r} selects no worker")
    return sorted(chosen)


def parse_hosts(spec: Any,
                enclosing: Callable[[str], tuple[list[str], str] | None] | None = None) -> tuple:
    """``"a:4,b:4"``, ``{"a": 4}``, ``[("a", 4)]``, or None -> ``(("a", 4), ...)`` in the order
    given; a host without ``:K`` gets one rank. ``enclosing(name)`` may turn a lone ``NAME`` or
    ``NAME:K`` into the hosts of the scheduler allocation this process runs in and their default
    ranks each (``hosts.scheduler.enclosing_hosts``: ``--hosts slurm``); None: a host's name."""
    if spec is None or spec == "" or spec == ():
        return ()
    if isinstance(spec, str):
        text = spec.strip()
        name, _, per = text.partition(":")
        inside = enclosing(name.strip()) if enclosing is not None and "," not in text else None
        if inside is not None:
            hosts, default = inside
            return tuple((h, _count(per or default, h)) for h in hosts)
        pairs = []
        for part in text.split(","):
            if not part.strip():
                continue
            host, sep, count = part.strip().rpartition(":")
            if not sep:
                host, count = count, "1"
            pairs.append((host.strip(), _count(count, host)))
        return tuple(pairs)
    items = spec.items() if isinstance(spec, dict) else spec
    try:
        return tuple((str(h), _count(k, h)) for h, k in items)
    except (TypeError, ValueError):
        raise ValueError(f"hosts must be like {{'node1': 4, 'node2': 4}} or 'node1:4,node2:4', "
                         f"got {spec!r}") from None


def _count(value: Any, host: str) -> int:
    try:
        count = int(str(value).strip())
    except ValueError:
        raise ValueError(f"host {host!r}: {value!r} is not a number of ranks; write HOST:K, "
                         "e.g. `node1:4`") from None
    return count
