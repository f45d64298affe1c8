"""SLURM behind ``scheduler.Allocation``: ``--slurm "SBATCH OPTIONS"`` asks for one job.

The job is a holder (``sbatch --parsable <options> --wrap 'exec sleep infinity'``) that keeps
the allocation while worlds come and go; join agents run in it as ``srun --overlap --whole``
steps, one per node; its state comes from ``scontrol show job``. Contract: the job never
outlives this process: a watchdog in a session of its own cancels it when a pipe only this
process writes closes (SIGKILL included), and ``release`` cancels it at once. Why these flags:
docs/how-it-works.md, Module notes.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable

from ..errors import DistTimeoutError, StartError
from .scheduler_api import JobState, NodeShare

__all__ = ["COMMANDS", "NEVER", "STEP_LAUNCHER", "SlurmJob", "describe_end", "enclosing_hosts",
           "parse_duration", "parse_job"]

COMMANDS = ("sbatch", "scontrol", "scancel", "srun")
#: Pending reasons that no wait can satisfy: the request is beyond what the cluster has.
NEVER = ("PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints",
         "AccountNotAllowed", "QOSNotAllowed", "InvalidAccount", "InvalidQOS",
         "PartitionDown", "PartitionInactive", "ReqNodeNotAvail", "DependencyNeverSatisfied",
         "JobHeldAdmin", "JobHeldUser", "MaxCpuPerAccount", "AssocMaxNodesPerJobLimit",
         "QOSMaxNodePerJobLimit", "QOSMaxCpuPerJobLimit", "QOSMaxWallDurationPerJobLimit")
_END_WORDS = {
    "TIMEOUT": "its time limit{limit} was reached",
    "CANCELLED": "it was cancelled (scancel, or an administrator)",
    "NODE_FAIL": "a node of it failed",
    "PREEMPTED": "it was preempted by another job",
    "OUT_OF_MEMORY": "it ran out of memory",
    "BOOT_FAIL": "a node failed to boot",
    "DEADLINE": "it reached its deadline",
    "FAILED": "its holder step failed",
    "COMPLETED": "its holder step ended",
}
_TIMEOUT = 30.0  # seconds any one SLURM command may take
#: ``--launcher srun``: a step on one node of the allocation the notebook already runs in
STEP_LAUNCHER = "srun --nodes=1 --ntasks=1 --nodelist={host} {command}"


def enclosing_hosts(name: str) -> tuple[list[str], str] | None:
    """``--hosts slurm``: the nodes of the allocation this process runs in (``salloc``,
    ``sbatch``) and the ranks per node SLURM was asked for (``SLURM_NTASKS_PER_NODE``, else
    "1"); None for a ``name`` that is not ``slurm`` (then it names a host)."""
    if name != "slurm":
        return None
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        raise ValueError("--hosts slurm: this is not inside a SLURM allocation (no "
                         "SLURM_JOB_NODELIST); run the notebook under `salloc` or name the hosts")
    if shutil.which("scontrol") is None:
        raise ValueError("--hosts slurm needs `scontrol` on PATH to expand the node list")
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                         text=True, timeout=_TIMEOUT, stdin=subprocess.DEVNULL)
    hosts = out.stdout.split()
    if out.returncode or not hosts:
        raise ValueError(f"`scontrol show hostnames {nodelist}` failed: {out.stderr.strip()}")
    per = os.environ.get("SLURM_NTASKS_PER_NODE", "1")
    return hosts, per.split("(")[0].split(",")[0]  # SLURM writes e.g. "4(x2)"


def describe_end(state: JobState) -> str:
    """SLURM's word for a job's end and what it means: ``TIMEOUT (its time limit, 00:01:00,
    was reached)``."""
    limit = f", {state.time_limit}," if state.time_limit not in ("", "UNLIMITED") else ""
    words = _END_WORDS.get(state.state, "").format(limit=limit)
    return f"{state.state} ({words})" if words else state.state


def parse_duration(text: str) -> float | None:
    """SLURM's ``[days-]hours:minutes:seconds`` (or ``minutes:seconds``) in seconds; None for
    UNLIMITED, NOT_SET and the like."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", (text or "").strip())
    if not m:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def _fields(line: str) -> list[tuple[str, str]]:
    """``scontrol -o``'s ``Key=Value`` tokens, in order (keys repeat, one group per node)."""
    return [tuple(tok.split("=", 1)) for tok in line.split() if "=" in tok]  # type: ignore


def _count_ids(text: str) -> int:
    """How many ids ``0-1,4`` names."""
    total = 0
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        total += int(hi) - int(lo) + 1 if hi else 1
    return total


def _ids(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return tuple(out)


def parse_job(line: str, expand: Callable[[str], list[str]]) -> tuple[JobState, list[NodeShare]]:
    """``scontrol show job -d -o J`` -> its state and what it holds on each node (``expand``
    turns a node list such as ``nbnode[1-2]`` into names)."""
    fields = _fields(line)
    first = dict(reversed(fields))  # the first value of each key
    limit = first.get("TimeLimit", "")
    left = None
    if first.get("JobState") == "RUNNING":
        total, ran = parse_duration(limit), parse_duration(first.get("RunTime", ""))
        if total is not None and ran is not None:
            left = max(total - ran, 0.0)
    state = JobState(first.get("JobState", "UNKNOWN"), first.get("Reason", ""), left, limit)
    cpt = first.get("CPUs/Task", "1")
    cpus_per_task = int(cpt) if cpt.isdigit() and int(cpt) > 1 else None
    groups: list[tuple[list[str], int, tuple[int, ...]]] = []
    for i, (key, value) in enumerate(fields):
        if key == "Nodes" and i + 1 < len(fields) and fields[i + 1][0] == "CPU_IDs":
            gres = next((v for k, v in fields[i + 2:i + 5] if k == "GRES"), "")
            m = re.search(r"gpu[^(]*\(IDX:([0-9,\-]+)\)", gres)
            groups.append((expand(value), _count_ids(fields[i + 1][1]),
                           _ids(m.group(1)) if m else ()))
    hosts = [h for names, _, _ in groups for h in names]
    per = _tasks_per_node(first, len(hosts))
    shares = [NodeShare(h, per[k], cpus, cpus_per_task, gpus)
              for k, (h, cpus, gpus) in enumerate((h, c, g) for names, c, g in groups
                                                  for h in names)]
    return state, shares


def _tasks_per_node(first: dict[str, str], nodes: int) -> list[int]:
    """Ranks on each node: ``--ntasks-per-node`` when given, else the job's tasks spread as
    SLURM's block distribution does (the first nodes take the remainder)."""
    per = first.get("NtasksPerN:B:S:C", "0").split(":")[0]
    if per.isdigit() and int(per) > 0:
        return [int(per)] * nodes
    tasks = int(first.get("NumTasks", "0") or 0) if first.get("NumTasks", "").isdigit() else 0
    tasks = max(tasks, nodes)
    return [tasks // nodes + (1 if k < tasks % nodes else 0) for k in range(nodes)]


class SlurmJob:
    """One SLURM allocation for this notebook (``scheduler.Allocation``)."""

    what = "SLURM job"

    def __init__(self, options: str) -> None:
        self.options = options
        try:
            self.args = shlex.split(options)
        except ValueError as exc:
            raise ValueError(f"--slurm {options!r}: {exc}; quote it as one string of sbatch "
                             "options, e.g. --slurm \"-N 2 --ntasks-per-node=2 -t 30\"") from None
        missing = [c for c in COMMANDS if shutil.which(c) is None]
        if missing:
            raise ValueError(f"--slurm needs SLURM's commands on PATH, and {', '.join(missing)} "
                             f"{'is' if len(missing) == 1 else 'are'} not there: run the "
                             "notebook on a login node of the cluster (or load its module, "
                             "e.g. `module load slurm`)")
        self.job_id: str | None = None
        self.shares: list[NodeShare] = []
        self.last: JobState | None = None
        self._watchdog: subprocess.Popen | None = None
        self._pipe: int | None = None
        self._lock = threading.Lock()

    # -- submit and wait -------------------------------------------------------------------
    def request(self) -> str:
        argv = ["sbatch", "--parsable", "--job-name=nbdist", "--output=/dev/null",
                *self.args, "--wrap", "exec sleep infinity"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT,
                              stdin=subprocess.DEVNULL)
        job = done.stdout.strip().split(";")[0]
        if done.returncode or not job.isdigit():
            raise ValueError(f"sbatch refused the allocation (--slurm {self.options!r}):\n"
                             + (done.stderr.strip() or done.stdout.strip()
                                or f"exit code {done.returncode}"))
        self.job_id = job
        self._start_watchdog(job)
        return job

    def _start_watchdog(self, job: str) -> None:
        """Cancel the job when this process ends, however it ends (see the module)."""
        read, write = os.pipe()
        try:
            self._watchdog = subprocess.Popen(
                ["sh", "-c", 'read _ ; exec scancel "$0" 2>/dev/null', job], stdin=read,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                close_fds=True)
        finally:
            os.close(read)
        self._pipe = write

    def wait(self, deadline: float, show: Callable[[JobState, float], None]) -> None:
        t0 = time.monotonic()
        pause = 0.1
        while True:
            state = self.state()
            if state.running:
                return
            waited = time.monotonic() - t0
            if state.ended:
                raise StartError(f"SLURM job {self.job_id} ended before it started: "
                                 f"{describe_end(state)}" + (f", reason {state.reason}"
                                                             if state.reason not in ("", "None")
                                                             else ""))
            if state.reason in NEVER:
                raise StartError(f"SLURM job {self.job_id} can never start: it is pending for "
                                 f"{state.reason} (the request is beyond what the cluster or "
                                 f"your account has: check -p/-N/-n/-t/-A in --slurm "
                                 f"{self.options!r} against `sinfo`); it was cancelled")
            show(state, waited)
            if time.monotonic() + pause > deadline:
                raise DistTimeoutError(f"SLURM job {self.job_id} was still {state.state} "
                                       f"({state.reason}) after {waited:.0f}s (--start-timeout); "
                                       "it was cancelled, nothing is left queued")
            time.sleep(pause)
            pause = min(pause * 1.5, 1.0)

    # -- what it holds ---------------------------------------------------------------------
    def _show(self, detail: bool) -> str:
        argv = ["scontrol", "show", "job", "-o", *(["-d"] if detail else []), str(self.job_id)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT,
                              stdin=subprocess.DEVNULL)
        if done.returncode:
            raise StartError(f"`{shlex.join(argv)}` failed: {done.stderr.strip()}")
        return done.stdout

    @staticmethod
    def expand(nodelist: str) -> list[str]:
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                              text=True, timeout=_TIMEOUT, stdin=subprocess.DEVNULL)
        return done.stdout.split()

    def state(self) -> JobState:
        if self.job_id is None:
            return JobState("NONE")
        try:
            line = self._show(detail=False)
        except (StartError, subprocess.TimeoutExpired, OSError):
            # gone from slurmctld's memory (MinJobAge), or slurmctld does not answer
            return self.last if self.last is not None and self.last.ended else JobState(
                "UNKNOWN")
        self.last, _ = parse_job(line, lambda nodes: [])
        return self.last

    def nodes(self) -> list[NodeShare]:
        if not self.shares:
            self.last, self.shares = parse_job(self._show(detail=True), self.expand)
        return self.shares

    def launcher(self) -> str:
        return (f"srun --jobid={self.job_id} --overlap --whole --nodes=1 --ntasks=1 "
                "--nodelist={host} --kill-on-bad-exit=0 {command}")

    @staticmethod
    def describe_end(state: JobState) -> str:
        return describe_end(state)

    def starter(self) -> None:
        return None  # the launcher template (srun) starts the agents

    def local_address(self) -> None:
        return None  # the default route's interface, or --iface

    def placed(self) -> str:
        return ""  # the hosts are SLURM's node names already

    def lost_why(self, host: str) -> None:
        return None  # the job's end is asked for as a whole (``allocation.ended``)

    # -- give it back ----------------------------------------------------------------------
    def release(self) -> None:
        with self._lock:
            job, self.job_id = self.job_id, None
            pipe, self._pipe = self._pipe, None
            dog, self._watchdog = self._watchdog, None
        if job is not None:
            try:
                subprocess.run(["scancel", job], capture_output=True, timeout=_TIMEOUT,
                               stdin=subprocess.DEVNULL)
            except (subprocess.TimeoutExpired, OSError):
                pass  # the watchdog tries again as its pipe closes
        if pipe is not None:
            os.close(pipe)
        if dog is not None:
            try:
                dog.wait(_TIMEOUT)
            except subprocess.TimeoutExpired:
                dog.kill()
                dog.wait()
