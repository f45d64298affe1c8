"""Run a case as a script: ``torchrun --standalone --nproc-per-node n prog.py`` or ``python
prog.py``, with plain torch (nbdist is not importable: no ``PYTHONPATH``, ``NBDIST_*`` left
out), in a fresh directory, bounded by a deadline that kills the whole process group."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from kernel_helpers import kill_tree

from .cases import Case
from .observe import Run, add_output, read_records, split_by_rank, uncaught
from .prelude import PRELUDE

__all__ = ["program", "quiet_port", "run_script"]

TEE = r"\[default(\d+)\]:"  # torchrun --tee's prefix on a rank's lines
# what plain torch (2.13-2.15, gloo) prints when a process aborts at exit after its program
# ended, in some runs of the same script (Gloo's threads outlive the interpreter: pytorch#179291):
# not the program's outcome. Under mp.spawn the parent sees the abort as the child's failure
# and stops, so such a run is run again (ATTEMPTS in all: the tutorial's setup()/cleanup()
# under two spawns aborted in 3 of 6 runs on torch 2.15, so 8 tries leave 1 in 256).
EXIT_ABORT = "terminate called without an active exception"
ATTEMPTS = 8
# plain torch's Gloo failing to connect on a loaded machine (2 cores, the world's run beside it):
# also run again
TORCH_FLAKES = ("Gloo connectFullMesh failed",)


def program(case: Case) -> str:
    """The program's text: the same in both runs."""
    return PRELUDE + "\n" + case.body


def _command(case: Case) -> list[str]:
    if case.style == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(case.n), "--tee", "3", "prog.py"]
    return [sys.executable, "prog.py"]


def quiet_port() -> int:
    """A TCP port free on 127.0.0.1 now, below the kernel's ephemeral range, so that no
    outgoing connection takes it before the program listens there."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    while True:
        port = random.randrange(10000, min(low, 30000))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def run_script(case: Case, where: Path, timeout: float = 180) -> Run:
    """Run ``case`` as a script in the empty directory ``where``; its records go to
    ``where/out``. A run that plain torch aborted at a process's exit is run again."""
    for attempt in range(1, ATTEMPTS + 1):
        run = _run_once(case, where, timeout)
        flaky = EXIT_ABORT in run.text or any(line in run.text for line in TORCH_FLAKES)
        if not (flaky and (run.failed or run.raised)) or attempt == ATTEMPTS:
            return run
        shutil.rmtree(where / "out")
    raise AssertionError("unreachable")


def _run_once(case: Case, where: Path, timeout: float) -> Run:
    ports = quiet_port(), quiet_port()
    out = where / "out"
    out.mkdir(parents=True)
    (where / "prog.py").write_text(program(case))
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith(("NBDIST_", "CONF_"))}
    env.update(CONF_OUT=str(out), CONF_PORT=str(ports[0]), CONF_PORT2=str(ports[1]))
    t0 = time.monotonic()
    proc = subprocess.Popen(_command(case), cwd=where, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)  # torchrun puts its workers in sessions of their own
        stdout, stderr = proc.communicate()
        raise TimeoutError(f"the script of {case.name} ran past {timeout}s:\n"
                           f"{stdout[-2000:]}\n{stderr[-2000:]}") from None
    run = Run(ranks=read_records(out), failed=proc.returncode != 0,
              seconds=time.monotonic() - t0, text=stdout + stderr)
    if case.style == "torchrun":  # a rank's lines carry --tee's prefix; torchrun's own none
        stdout_by, stderr_by = split_by_rank(stdout, TEE, None), split_by_rank(stderr, TEE, None)
    else:
        stdout_by, stderr_by = split_by_rank(stdout, r"(?!)"), split_by_rank(stderr, r"(?!)")
    add_output(run, case.style, stdout_by, stderr_by)
    run.raised = uncaught(stderr_by)
    if run.failed and not run.raised and EXIT_ABORT in stderr:
        run.failed = False  # plain torch's abort at exit, after the program ran to its end
    return run
