"""``auto_init_rpc`` in a fresh local world: nothing listens beyond loopback.

Real subprocess worlds (one rank with no ``MASTER_ADDR``; two ranks with ``MASTER_ADDR`` =
127.0.0.1, as ``torchrun --standalone`` would set), ``TP_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME``
removed from their environment. Each rank lists its own listening sockets with psutil while the
world is up. Where ``unshare`` works, a second run makes the host name resolve to a
non-loopback address (a private ``/etc/hosts`` in a mount namespace), which is where torch's
TensorPipe and Gloo would listen if nbdist did not pin them.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, free_port

SCRIPT = """
import json
import os
import psutil
import nbdist.parallel as todist

def listeners():
    return [[c.laddr.ip, c.laddr.port] for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN]

@todist.auto_init_rpc()
def main():
    todist.barrier()  # every rank is up, every listener open
    mine = listeners()
    todist.barrier()
    return mine

if __name__ == "__main__":
    out = {"listening": main(), "env_after": [os.environ.get("TP_SOCKET_IFNAME"),
                                              os.environ.get("GLOO_SOCKET_IFNAME")]}
    print("RESULT " + json.dumps(out), flush=True)
"""


def _non_loopback_ipv4() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback:
                return a.address
    return None


def _run_world(tmp_path: Path, n: int, prefix: list[str] | None = None) -> list[dict]:
    script = tmp_path / "entry.py"
    script.write_text(SCRIPT)
    base = {k: v for k, v in os.environ.items()
            if k not in ("TP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT",
                         "RANK", "WORLD_SIZE")}
    base.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    port = str(free_port())
    procs = []
    for rank in range(n):
        env = dict(base)
        if n > 1:
            env.update(RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([*(prefix or []), sys.executable, str(script)], env=env,
                                      cwd=tmp_path, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=180)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    assert [p.returncode for p in procs] == [0] * n, outs
    return [json.loads(o.split("RESULT ", 1)[1]) for o in outs]


def _check_loopback_only(results: list[dict]) -> None:
    for rank, res in enumerate(results):
        assert res["listening"], f"rank {rank}: expected TensorPipe listeners"
        for ip, port in res["listening"]:
            assert ipaddress.ip_address(ip).is_loopback, f"rank {rank} listens on {ip}:{port}"
        assert res["env_after"] == [None, None]  # the pin is undone after joining


@pytest.mark.slow  # real subprocess worlds: ~3-8 s each
@pytest.mark.parametrize("n", [1, 2])
def test_fresh_local_world_listens_on_loopback_only(tmp_path: Path, n: int):
    _check_loopback_only(_run_world(tmp_path, n))


def test_loopback_even_where_the_host_name_resolves_elsewhere(tmp_path: Path):
    ip = _non_loopback_ipv4()
    unshare = shutil.which("unshare")
    if ip is None or unshare is None or os.getuid() != 0:
        pytest.skip("needs root, unshare and a non-loopback IPv4 address")
    if subprocess.run([unshare, "--mount", "--uts", "true"], capture_output=True).returncode:
        pytest.skip("unshare --mount --uts is not permitted here")
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{ip} nbdist-elsewhere\n")
    wrapper = tmp_path / "elsewhere.sh"
    wrapper.write_text(f'mount --bind {hosts} /etc/hosts && hostname nbdist-elsewhere && '
                       f'exec "$@"\n')
    prefix = [unshare, "--mount", "--uts", "--propagation", "private", "sh", str(wrapper)]
    probe = subprocess.run([*prefix, sys.executable, "-c",
                            "import socket; print(socket.gethostbyname(socket.gethostname()))"],
                           capture_output=True, text=True, timeout=30)
    if probe.stdout.strip() != ip:
        pytest.skip(f"could not make the host name resolve to {ip}: {probe.stderr.strip()}")
    _check_loopback_only(_run_world(tmp_path, 2, prefix))
