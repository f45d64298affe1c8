"""Fake hosts on one machine: network namespaces on a bridge (needs root and `ip`).

``FakeHosts(["h1", "h2"])`` makes a bridge with the notebook's address and one namespace per
host, each with loopback and one veth address on the bridge; ``close()`` removes them all.
The launcher ``ip netns exec {host} {command}`` then runs a command "on" a host.
"""

from __future__ import annotations

import os
import shutil
import subprocess

__all__ = ["FakeHosts", "can_make_namespaces"]

LAUNCHER = "ip netns exec {host} {command}"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=30)


def can_make_namespaces() -> str | None:
    """None when namespaces can be made here, else why not."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    if shutil.which("ss") is None:
        return "the `ss` command (iproute2) is not installed"
    probe = f"nbdp{os.getpid() % 100000}"
    steps = [("netns", "add", probe),
             ("link", "add", f"{probe}b", "type", "bridge"),
             ("link", "add", f"{probe}v", "type", "veth", "peer", "name", "eth0",
              "netns", probe)]
    try:
        for step in steps:
            made = _ip(*step, check=False)
            if made.returncode:
                return f"`ip {' '.join(step)}` failed: {made.stderr.strip()}"
    finally:
        _ip("link", "del", f"{probe}v", check=False)
        _ip("link", "del", f"{probe}b", check=False)
        _ip("netns", "del", probe, check=False)
    return None


class FakeHosts:
    """A bridge ``nbdbr<tag>`` with the notebook's address (``.1`` of a /24 picked from this
    process's pid, so two runs at once, or the leftovers of a killed one, never share a
    subnet) and namespaces at ``.2``, ``.3``, ..."""

    def __init__(self, names: list[str]) -> None:
        self.names = list(names)
        pid = os.getpid()
        tag = f"{pid % 10000}"
        self.bridge = f"nbdbr{tag}"
        self.prefix = f"10.{150 + pid % 100}.{(pid // 100) % 250}"
        self.address = f"{self.prefix}.1"
        self.ns = {h: f"nbd{tag}{h}" for h in names}  # namespaces are global: names of ours
        self.addresses: dict[str, str] = {}
        self.close()  # leftovers of a killed run that had our pid's tag
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, host in enumerate(names, start=2):
                ns, outside = self.ns[host], f"nbdv{tag}{i}"
                _ip("netns", "add", ns)
                _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0",
                    "netns", ns)
                _ip("link", "set", outside, "master", self.bridge)
                _ip("link", "set", outside, "up")
                addr = f"{self.prefix}.{i}"
                self.addresses[host] = addr
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    launcher = LAUNCHER  # host labels given to nbdist are the namespace names (``ns``)

    def link(self, host: str, up: bool) -> None:
        """Cut (or restore) a host's link to the bridge."""
        i = self.names.index(host) + 2
        _ip("link", "set", f"nbdv{self.bridge[5:]}{i}", "up" if up else "down")

    def listening(self, host: str | None = None) -> list[str]:
        """Local addresses of TCP listeners in ``host``'s namespace (None: the root one)."""
        cmd = ["ss", "-Hltn"]
        if host is not None:
            cmd = ["ip", "netns", "exec", self.ns[host], *cmd]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30)
        return [line.split()[3] for line in out.stdout.splitlines() if line.strip()]

    def close(self) -> None:
        for ns in self.ns.values():
            _ip("netns", "del", ns, check=False)
        for i in range(2, len(self.names) + 2):
            _ip("link", "del", f"nbdv{self.bridge[5:]}{i}", check=False)
        _ip("link", "del", self.bridge, check=False)
