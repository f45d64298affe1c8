"""The shared SLURM test bed (``../shared/slurm``) for tests and benchmarks: start it in one
shape, ask it about jobs, stop it. Needs root and the scripts beside the project."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

__all__ = ["BED", "IFACE", "SlurmBed", "cannot_run", "jobs"]

BED = Path(__file__).resolve().parent.parent.parent / "shared" / "slurm"
IFACE = "nbslbr0"  # the bridge the nodes reach this machine on
CONF = "/tmp/nbslurm/etc/slurm.conf"


def cannot_run() -> str | None:
    """None when the test cluster can start here, else why not."""
    if not (BED / "up.sh").is_file():
        return f"no SLURM test bed at {BED} (../shared/slurm beside the project)"
    if os.geteuid() != 0:
        return "the SLURM test bed needs root (namespaces, daemons)"
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        return "slurm-wlm is not installed and there is no apt-get to install it"
    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        return "the SLURM test bed needs iproute2 and util-linux (ip, nsenter)"
    return None


def jobs() -> list[str]:
    """Ids of the jobs slurmctld still lists as pending, running or completing."""
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                         timeout=30)
    return out.stdout.split()


class SlurmBed:
    """``up()`` the cluster in one shape (nodes, task plugin, fake GPUs), ``down()`` after;
    ``SLURM_CONF`` is set in this process while it is up."""

    def __init__(self, nodes: int = 3, task: str = "task/affinity", gpus: int = 2) -> None:
        self.env = {**os.environ, "NB_SLURM_NODES": str(nodes), "NB_SLURM_TASK_PLUGIN": task,
                    "NB_SLURM_GPUS": str(gpus)}
        self._conf = os.environ.get("SLURM_CONF")

    def up(self) -> None:
        subprocess.run([str(BED / "down.sh")], capture_output=True, timeout=120)
        done = subprocess.run([str(BED / "up.sh")], env=self.env, capture_output=True,
                              text=True, timeout=600)
        if done.returncode:
            raise RuntimeError(f"up.sh failed:\n{done.stdout}\n{done.stderr}")
        os.environ["SLURM_CONF"] = CONF
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # every node idle: ready for jobs
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                                 timeout=30).stdout.split()
            if out and all(s == "idle" for s in out):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the test cluster's nodes are not idle: {out}")

    def down(self) -> None:
        try:
            subprocess.run([str(BED / "down.sh")], capture_output=True, timeout=120)
        finally:
            if self._conf is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = self._conf
