"""IPython magics: thin wrappers that parse arguments and call the Python API.

``%dist_start``, ``%%dist``, ``%dist_status``, ``%dist_restart``, ``%dist_stop``,
``%dist_push`` and ``%dist_pull``. A user
mistake becomes a ``UsageError`` that says what to do; nothing is started when one is raised.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shlex
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments

from .cluster import core as _cluster
from .errors import ClusterStateError

__all__ = ["DistMagics"]


def _start_args(f: Any) -> Any:
    """The flags shared by ``%dist_start`` and ``%dist_restart``."""
    for dec in reversed([
        argument("--name", default=None, help="the notebook's RPC name (default worker0)"),
        argument("--worker-name", default=None,
                 help="worker name pattern with {rank} (default worker{rank}), or roles: "
                      "ps,trainer{rank} names rank 1 ps and the rest trainer2, trainer3, ..."),
        argument("--threads", type=int, default=None,
                 help="torch threads per worker (default: cores / ranks)"),
        argument("--rpc-timeout", type=float, default=None,
                 help="default RPC timeout in seconds (default 60)"),
        argument("--process-group", default=None, choices=["gloo", "nccl", "auto"],
                 help="also start a torch.distributed process group over the same ranks: "
                      "gloo, nccl (a GPU per rank), or auto (nccl where every rank has a GPU "
                      "of its own, else gloo)"),
        argument("--gpus", default=None,
                 help="auto (default: rank r gets GPU r mod the visible ones), none (workers on "
                      "the CPU), or GPU indices such as 0,2"),
        argument("--device-maps", default=None, choices=["auto", "none"],
                 help="auto: TensorPipe device maps between the ranks' GPUs, so CUDA tensors "
                      "travel over RPC GPU to GPU"),
        argument("--rpc", action=argparse.BooleanOptionalAction, default=None,
                 help="--no-rpc: no torch RPC agent on any rank, a process group (gloo) "
                      "instead; cells, --local SPMD, output, status and restart work as "
                      "usual (restart: --rpc brings RPC back)"),
        argument("--start-timeout", type=float, default=None,
                 help="give up starting after this many seconds (default 60, and 2 s more a "
                      "rank per core for a big world: 256 ranks on 2 cores get 316)"),
        argument("--hosts", default=None,
                 help="ranks on other machines after the local ones: HOST:K[,HOST:K...], or "
                      "slurm[:K] for the current SLURM allocation (restart: none drops them)"),
        argument("--slurm", default=None,
                 help="ask SLURM for the hosts: one allocation with these sbatch options, in "
                      "quotes (\"-N 2 --ntasks-per-node=4 -t 1:00:00 -p gpu\"), its ranks after "
                      "the local ones, kept across restarts until %%dist_stop --hosts "
                      "(restart: none drops it)"),
        argument("--ray", default=None,
                 help="ask Ray for the hosts: a placement group with these options, in "
                      "quotes (\"--nodes 2 --ranks-per-node 2 --cpus 2 --gpus 1 --strategy "
                      "SPREAD\"), its ranks after the local ones, kept across restarts until "
                      "%%dist_stop --hosts (restart: none drops it)"),
        argument("--iface", default=None,
                 help="with --hosts: this machine's interface or address the hosts reach "
                      "(with --slurm: default the default route's)"),
        argument("--launcher", default=None,
                 help="with --hosts: ssh (default), srun, or a template with {host} and "
                      "{command}, e.g. 'ip netns exec {host} {command}'"),
        argument("--remote-python", default=None,
                 help="with --hosts: the Python on the hosts (default: this one's path)"),
        argument("--heal", dest="heal", action="store_const", const=True, default=None,
                 help="replace a worker that dies on its own, the others keeping their "
                      "state (gives up on a rank that dies 3 times in 60 s)"),
        argument("--no-heal", dest="heal", action="store_const", const=False,
                 help="(restart) stop healing"),
        argument("--tabs", action=argparse.BooleanOptionalAction, default=None,
                 help="%%%%dist cells show a live tab per rank (status badge, output) instead "
                      "of one stream; a cell's --tabs/--no-tabs overrides it"),
        argument("--aggregate", default=None, choices=["on", "off", "auto"],
                 help="a line printed by several ranks at once shows once, led by the ranks "
                      "([worker1-12] ...); auto (default): on from 8 workers"),
        argument("--rpc-transport", default=None, choices=["auto", "shm", "tcp"],
                 help="how torch RPC carries messages between this machine's ranks: shm "
                      "(TensorPipe's shared memory), tcp (loopback), auto (default): shm up "
                      "to 16 ranks, tcp above (a big world starts and costs less memory)"),
    ]):
        f = dec(f)
    return f


def _count(raw: str | None, magic: str) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"{magic}: the number of workers must be a whole number, got {raw!r}; "
                         f"for example `{magic} 4`") from None


_DOLLAR = re.compile(r"\$(\w+)")


def _expand(line: str, ns: dict) -> str:
    """``$name`` from the user's namespace, leaving ``{rank}`` alone.

    The magics take raw lines (``@no_var_expand``) because IPython's own expansion gives up on
    the whole line when it meets ``{rank}``, so ``%dist_start $N --worker-name obs{rank}``
    would arrive as the literal ``$N``.
    """
    def sub(m: re.Match) -> str:
        name = m.group(1)
        if name not in ns:
            raise UsageError(f"${name} is not defined in the notebook")
        return shlex.quote(str(ns[name]))

    return _DOLLAR.sub(sub, line)


def _parse(magic_fn: Any, line: str, magic: str, ns: dict | None = None) -> Any:
    """Shell-style quoting (``--worker-name "obs{rank}"``), argparse errors as UsageError."""
    if ns is not None:
        line = _expand(line, ns)
    try:
        argv = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"{magic}: {exc}") from None
    for i, arg in enumerate(argv[:-1]):  # --slurm "-N2": a value argparse takes for a flag
        if arg in ("--slurm", "--ray"):
            argv[i:i + 2] = [f"{arg}={argv[i + 1]}"]
            break
    try:
        return magic_fn.parser.parse_args(argv)
    except UsageError as exc:
        raise UsageError(f"{magic}: {exc}; see `{magic}?` for the flags") from None


_ON_OFF = {"on": True, "off": False}


def _settings(args: Any) -> dict:
    hosts = args.hosts
    if hosts is not None and hosts.strip().lower() in ("none", "local", ""):
        hosts = ()
    return {k: v for k, v in {
        "name": args.name, "worker_name": args.worker_name, "threads": args.threads,
        "rpc_timeout": args.rpc_timeout, "process_group": args.process_group,
        "start_timeout": args.start_timeout, "hosts": hosts, "iface": args.iface,
        "launcher": args.launcher, "remote_python": args.remote_python,
        "gpus": args.gpus, "device_maps": args.device_maps, "heal": args.heal,
        "rpc": args.rpc, "aggregate": _ON_OFF.get(args.aggregate, args.aggregate),
        "slurm": args.slurm, "ray": args.ray, "tabs": args.tabs,
        "rpc_transport": args.rpc_transport}.items()
        if v is not None}


def _require() -> _cluster.Cluster:
    c = _cluster.current()
    if c is None:
        raise UsageError("no nbdist world is running; start one with `%dist_start N`")
    return c


@magics_class
class DistMagics(Magics):
    """Start, use, watch and stop a local torch.distributed.rpc world from a notebook."""

    @magic_arguments()
    @argument("n", nargs="?", default=None, help="number of worker ranks (1..N)")
    @_start_args
    @no_var_expand
    @line_magic
    def dist_start(self, line: str) -> None:
        """Start N worker ranks; this notebook becomes rank 0 of their RPC world (with
        ``--no-rpc``: of their process group, with no RPC agent).

        Example: ``%dist_start 2 --name agent --worker-name obs{rank}``
        """
        args = _parse(self.dist_start, line, "%dist_start", self.shell.user_ns)
        n = _count(args.n, "%dist_start")
        if n is None:
            raise UsageError("%dist_start needs the number of workers, e.g. `%dist_start 4`")
        try:
            _cluster.start(n, **_settings(args))
        except ValueError as exc:
            raise UsageError(f"%dist_start: {exc}") from None
        except ClusterStateError:
            raise UsageError("a world is already running; use `%dist_restart` to start a new one "
                             "(it takes the same flags), or `%dist_stop` first") from None

    @magic_arguments()
    @argument("n", nargs="?", default=None, help="number of worker ranks (default: as before)")
    @argument("--keep", action="store_true",
              help="live workers keep their process and variables; dead ranks and added "
                   "ones start fresh, ranks beyond N stop")
    @_start_args
    @no_var_expand
    @line_magic
    def dist_restart(self, line: str) -> None:
        """Stop the world and start a new one; flags not given keep their previous values.

        ``--keep`` rebuilds the RPC world around the live workers instead: their variables
        stay, dead ranks come back empty, ``N`` grows or shrinks the world.
        """
        args = _parse(self.dist_restart, line, "%dist_restart", self.shell.user_ns)
        n = _count(args.n, "%dist_restart")
        try:
            if _cluster.current() is None and _last_spec() is None:
                if n is None:
                    raise UsageError("no world to restart; start one with `%dist_start N`")
                _cluster.start(n, **_settings(args))
            else:  # the whole previous spec, whatever was given to %dist_start
                _cluster.restart(n, keep=args.keep, **_settings(args))
        except ValueError as exc:
            raise UsageError(f"%dist_restart: {exc}") from None

    @line_magic
    def dist_stop(self, line: str) -> None:
        """Stop the world: every worker process ends; RPC here is ready for a new world.
        ``--hosts`` also ends the join agents kept warm on other hosts."""
        if line.strip() not in ("", "--hosts"):
            raise UsageError("%dist_stop takes no arguments but --hosts")
        c = _cluster.current()
        if c is None:
            print("nbdist: no world is running")
        else:
            c.stop()
            print("nbdist: stopped")
        if line.strip() == "--hosts":
            n = _cluster.release_hosts()
            print(f"nbdist: ended the agents on {n} host{'s' if n != 1 else ''}")

    @line_magic
    def dist_status(self, line: str) -> Any:
        """A table of every rank: pid, alive or how it died, CPU %, memory, uptime (and host,
        when the world spans hosts); ``--hosts``: one line per host."""
        if line.strip() not in ("", "--hosts"):
            raise UsageError("%dist_status takes no arguments but --hosts")
        c = _cluster.latest()
        if c is None or not c.ranks:
            raise UsageError("no nbdist world is running; start one with `%dist_start N`")
        return c.hosts_status() if line.strip() == "--hosts" else c.status()

    @magic_arguments()
    @argument("rank", nargs="?", default=None,
              help="rank number or name (default: the rank whose error was shown last)")
    @no_var_expand
    @line_magic
    def dist_debug(self, line: str) -> None:
        """pdb on a worker's last failure, typed here: p, pp, l, ll, w, up, down, q."""
        args = _parse(self.dist_debug, line, "%dist_debug", self.shell.user_ns)
        c = _require()
        try:
            c.debug(args.rank)
        except ValueError as exc:
            raise UsageError(f"%dist_debug: {exc}") from None

    @magic_arguments()
    @argument("rank", nargs="?", default=None, help="rank number or name (default: every worker)")
    @argument("--tail", type=int, default=50, help="how many lines (default 50; 0: all)")
    @no_var_expand
    @line_magic
    def dist_logs(self, line: str) -> None:
        """What workers printed, shown or not (also outside cells, or past a cell's limit)."""
        args = _parse(self.dist_logs, line, "%dist_logs", self.shell.user_ns)
        c = _require()
        if args.tail < 0:
            raise UsageError("%dist_logs: --tail takes a number of lines >= 0 (0: all)")
        try:
            from .spec import parse_ranks

            ranks = parse_ranks(args.rank, c.names)
        except ValueError as exc:
            raise UsageError(f"%dist_logs: {exc}") from None
        for r in ranks:
            lines = c.logs(r, tail=args.tail or None)
            name = c.names[r]
            print(f"--- rank {r} ({name}): {len(lines)} line{'s' if len(lines) != 1 else ''}")
            for text in lines:
                print(f"[{name}] {text}")

    @magic_arguments()
    @argument("--ranks", default=None, help="ranks or names: 1,3 or 1-3 or obs2 (default: all)")
    @argument("--local", action="store_true", help="also run the cell here, as rank 0, at the "
              "same time (for SPMD code such as DDP and collectives)")
    @argument("--timeout", type=float, default=None, help="interrupt the cell after S seconds")
    @argument("--no-fail-fast", dest="fail_fast", action="store_false", help="with --local: "
              "let the other ranks run on when one fails (by default the first rank to raise "
              "or die interrupts the others and the cell ends with its error)")
    @argument("--grid", action="store_true", help="lay each rank's rich outputs (plots, "
              "displays) side by side at the end of the cell, one column per rank")
    @argument("--tabs", action=argparse.BooleanOptionalAction, default=None, help="a live "
              "tab per rank with a status badge (running, done, failed, dead) and its output, "
              "instead of one stream; default: the world's setting (%%dist_start --tabs)")
    @argument("--aggregate", default=None, choices=["on", "off"], help="this cell only: a "
              "line printed by several ranks at once shows once, led by the ranks (on), or "
              "once per rank (off); default: the world's setting")
    @no_var_expand
    @cell_magic
    def dist(self, line: str, cell: str) -> None:
        """Run the cell on worker ranks; their output and last expressions show here."""
        args = _parse(self.dist, line, "%%dist", self.shell.user_ns)
        if args.timeout is not None and args.timeout <= 0:
            raise UsageError("%%dist: --timeout must be a positive number of seconds")
        c = _require()
        try:
            from .spec import parse_ranks

            targets = parse_ranks(args.ranks, c.names)
        except ValueError as exc:
            raise UsageError(f"%%dist: {exc}") from None
        aggregate = _ON_OFF.get(args.aggregate)
        with _tabs(c, targets, c.tabs if args.tabs is None else args.tabs):
            if not args.local:
                c.run(cell, ranks=targets, timeout=args.timeout, grid=args.grid,
                      aggregate=aggregate)
                return
            from .cluster.spmd import run_with_local

            with c.rich_cell(targets, grid=args.grid), c.aggregating(aggregate, targets):
                run_with_local(c, self.shell, cell, targets, args.timeout,
                               args.fail_fast)


    @magic_arguments()
    @argument("names", nargs="+", help="notebook variables to send")
    @argument("--ranks", default=None, help="ranks or names: 1,3 or 1-3 or obs2 (default: all)")
    @no_var_expand
    @line_magic
    def dist_push(self, line: str) -> None:
        """Bind notebook variables in the workers' ``__main__`` (``c[ranks].push``)."""
        args = _parse(self.dist_push, line, "%dist_push", self.shell.user_ns)
        ns = self.shell.user_ns
        missing = [n for n in args.names if n not in ns]
        if missing:
            raise UsageError(f"%dist_push: {missing[0]!r} is not defined in the notebook")
        _view(args.ranks, "%dist_push").push({n: ns[n] for n in args.names})

    @magic_arguments()
    @argument("names", nargs="+", help="variables to read on the workers")
    @argument("--ranks", default=None, help="ranks or names: 1,3 or 1-3 or obs2 (default: all)")
    @no_var_expand
    @line_magic
    def dist_pull(self, line: str) -> dict:
        """``{rank: value}`` of a variable in the workers' ``__main__`` (``c[ranks].pull``);
        several names: a tuple per rank."""
        args = _parse(self.dist_pull, line, "%dist_pull", self.shell.user_ns)
        names = args.names[0] if len(args.names) == 1 else args.names
        return _view(args.ranks, "%dist_pull").pull(names)


def _tabs(c: _cluster.Cluster, targets: list[int], on: bool) -> Any:
    """Around a ``%%dist`` cell: a tab per rank when ``on`` (the widget stack is imported
    only then)."""
    if not on:
        return contextlib.nullcontext()
    from .display.tabs import rank_tabs

    return rank_tabs(c, targets)


def _view(ranks: str | None, magic: str) -> Any:
    """The view ``--ranks`` names in the running world; a bad one is a UsageError."""
    c = _require()
    try:
        from .spec import parse_ranks

        return c[parse_ranks(ranks, c.names)]
    except ValueError as exc:
        raise UsageError(f"{magic}: {exc}") from None


def _last_spec() -> Any:
    return _cluster.last_spec()
