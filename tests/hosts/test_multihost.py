"""A world across hosts: fake hosts are network namespaces on a bridge (tests/fakehosts.py),
started with the launcher ``ip netns exec {host} {command}``. Skipped, with the reason, where
namespaces cannot be made (not root, no iproute2)."""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from conftest import child_pids, listening, wait_until
from fakehosts import FakeHosts, can_make_namespaces

import nbdist
from nbdist.control.channel import HandshakeError, connect
from nbdist.errors import StartError, WorkerDiedError
from nbdist.hosts.host_agents import AGENT_SILENCE

WHY = can_make_namespaces()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY is not None, reason=f"fake hosts: {WHY}")]


def _netns_inode(ns: str | None) -> str:
    cmd = ["readlink", "/proc/self/ns/net"]
    if ns is not None:
        cmd = ["ip", "netns", "exec", ns, *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


def _pids_in(fh: FakeHosts, host: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", fh.ns[host]], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


@pytest.fixture(scope="module")
def fakehosts():
    fh = FakeHosts(["a", "b"])
    try:
        yield fh
    finally:
        nbdist.release_hosts()
        fh.close()


def _start(fh: FakeHosts, n: int = 1, **kw):
    return nbdist.start(n, hosts={fh.ns["a"]: 2, fh.ns["b"]: 2}, iface=fh.address,
                        launcher=fh.launcher, quiet=True, **kw)


@pytest.fixture(scope="module")
def hostworld(fakehosts):
    c = _start(fakehosts)
    try:
        c.run("print('up')", show=False)  # each rank's log file opens now, not in a test
        c.flush()
        yield fakehosts, c
    finally:
        c.stop()
        nbdist.release_hosts()


# -- code the ranks run, defined here as a notebook would ------------------------------------
class Counter:
    def __init__(self, start: int) -> None:
        self.value = start

    def add(self, k: int) -> int:
        self.value += k
        return self.value


def bump_remote(rref, k):
    """Runs on one host and calls the RRef's owner on another."""
    return rref.rpc_sync().add(k)


def where():
    return os.readlink("/proc/self/ns/net"), os.environ.get("TP_SOCKET_IFNAME")


def weighted(x, w):
    return (x * w).sum()


# -- behaviour --------------------------------------------------------------------------------
def test_ranks_are_placed_on_their_hosts_and_torch_binds_there(hostworld):
    fh, c = hostworld
    assert c.world_size == 6
    assert [c.ranks[r].host for r in range(6)] == [None, None, fh.ns["a"], fh.ns["a"],
                                                   fh.ns["b"], fh.ns["b"]]
    mine = _netns_inode(None)
    seen = {r: rpc.rpc_sync(c.names[r], where) for r in range(1, 6)}
    assert seen[1][0] == mine
    assert {seen[2][0], seen[3][0]} == {_netns_inode(fh.ns["a"])}
    assert {seen[4][0], seen[5][0]} == {_netns_inode(fh.ns["b"])}
    assert seen[2][1] == seen[4][1] == "eth0"  # each host's interface toward the notebook
    table = str(c.status())
    assert "host" in table.splitlines()[0] and fh.ns["a"] in table and "local" in table
    hosts = str(c.hosts_status())
    assert fh.ns["a"] in hosts and fh.ns["b"] in hosts and "alive" in hosts


def test_a_big_worlds_status_groups_ranks_by_host(hostworld):
    """Issue 52: past the threshold (lowered to 1 worker here) alike ranks share a line per
    host; a line never mixes hosts, and each host's ranks are all on its lines."""
    import re

    fh, c = hostworld
    table = c.status()
    table.small = 1
    lines = [re.split(r"\s{2,}", line.strip()) for line in str(table).splitlines()[1:-1]]
    hosts = {}
    lines = [line for line in lines if line[0] != "-"]  # the template's
    for ranks, _, host, *_ in lines:
        for part in ranks.split(","):
            a, _, b = part.partition("-")
            for r in range(int(a), int(b or a) + 1):
                hosts[r] = host
    assert hosts == {0: "local", 1: "local", 2: fh.ns["a"], 3: fh.ns["a"], 4: fh.ns["b"],
                     5: fh.ns["b"]}, lines
    assert len(lines) <= 6 and [line[2] for line in lines] == sorted(
        (line[2] for line in lines), key=["local", fh.ns["a"], fh.ns["b"]].index)


def test_rref_owned_on_one_host_is_used_from_another(hostworld):
    fh, c = hostworld
    counter = rpc.remote(c.names[2], Counter, args=(10,))  # owned on host a
    assert rpc.rpc_sync(c.names[4], bump_remote, args=(counter, 5)) == 15  # used from host b
    assert counter.rpc_sync().add(1) == 16
    assert counter.to_here().value == 16


def test_dist_autograd_across_hosts_equals_local_autograd(hostworld):
    fh, c = hostworld
    torch.manual_seed(0)
    xs = [torch.randn(3, 4) for _ in range(3)]
    w = torch.randn(3, 4, requires_grad=True)
    local = sum(weighted(x, w) for x in xs)
    local.backward()
    expected = w.grad.clone()
    w2 = w.detach().clone().requires_grad_(True)
    with dist_autograd.context() as ctx:
        parts = [rpc.rpc_sync(c.names[r], weighted, args=(x, w2))
                 for r, x in zip((1, 3, 5), xs, strict=True)]
        loss = sum(parts)
        dist_autograd.backward(ctx, [loss])
        grads = dist_autograd.get_gradients(ctx)
    assert torch.allclose(loss, local.detach())
    assert torch.allclose(grads[w2], expected)


def test_cells_run_on_every_host_with_output_tagged_by_rank(hostworld, capsys):
    fh, c = hostworld
    out = c.run("import os\nprint('hello from', os.environ['NBDIST_RANK'])\n2 + 3", show=True)
    assert out == {r: "5" for r in range(1, 6)}
    c.flush()
    text = capsys.readouterr().out
    for r in range(1, 6):
        assert f"hello from {r}" in text
        assert f"[{c.names[r]}]" in text


def test_a_view_spans_hosts_with_real_values_both_ways(hostworld):
    """Issue 36: ``c[:]`` over ranks on three machines: one call reaches each where it runs,
    a tensor scattered across hosts gathers back equal, a notebook class comes back whole."""
    fh, c = hostworld
    homes = {r: ns for r, (ns, _) in c[:].call(where).items()}
    assert homes[1] == _netns_inode(None)
    assert homes[2] == homes[3] == _netns_inode(fh.ns["a"])
    assert homes[4] == homes[5] == _netns_inode(fh.ns["b"])
    data = torch.randn(5, 600_000)  # 2.4 MB shares: over TCP to the hosts, shm to rank 1
    c[:].scatter("rows", data)
    assert torch.equal(c[:].gather("rows"), data)
    counters = c[2:5].call(Counter, 7)
    assert sorted(counters) == [2, 3, 4] and all(type(k) is Counter and k.value == 7
                                                 for k in counters.values())
    with pytest.raises(nbdist.DistCallError) as info:
        c[[3, 5]].pull("nowhere")
    assert [f.rank for f in info.value.failures] == [3, 5]


def test_listeners_only_on_loopback_and_the_chosen_addresses(hostworld):
    fh, c = hostworld
    allowed = {None: {"127.0.0.1", "::1", fh.address}}
    for host in ("a", "b"):
        allowed[host] = {"127.0.0.1", "::1", fh.addresses[host]}
    for host in ("a", "b"):  # every listener in a host's namespace is one of ours
        addrs = {a.rsplit(":", 1)[0].strip("[]") for a in fh.listening(host)}
        assert addrs, f"nothing listens on host {host}: the ranks there serve RPCs"
        assert addrs <= allowed[host], f"host {host} listens on {addrs - allowed[host]}"
    # the root namespace has other programs' listeners: check this process and its children
    addrs = {a.rsplit(":", 1)[0].strip("[]") for a in _listeners_of_our_processes()}
    assert fh.address in addrs and addrs <= allowed[None], addrs


def _listeners_of_our_processes() -> list[str]:
    """``address:port`` of the listeners of this process and its descendants."""
    return [f"{ip}:{port}" for _, ip, port in listening({os.getpid(), *child_pids()})]


def test_the_store_rejects_a_wrong_key_before_unpickling(hostworld, tmp_path):
    fh, c = hostworld
    address = c._world.store.address
    with pytest.raises(HandshakeError):
        connect(address, b"not the key" * 3, timeout=5.0)
    # a peer that skips the handshake and sends a pickle: nothing of it is ever loaded
    marker = tmp_path / "unpickled"

    class Plant:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    sock = socket.create_connection(address, timeout=5.0)
    try:
        sock.recv(32)  # the server's nonce
        blob = pickle.dumps(Plant())
        sock.sendall(len(blob).to_bytes(4, "big") + blob + b"\0" * 64)
        sock.settimeout(5.0)
        try:
            assert sock.recv(100) == b""  # dropped
        except ConnectionResetError:
            pass  # dropped with bytes unread
    finally:
        sock.close()
    assert not marker.exists()
    assert c.run("1", ranks=[4], show=False) == {4: "1"}  # the world did not notice


def test_interrupt_reaches_a_rank_on_another_host(hostworld):
    fh, c = hostworld
    from nbdist.errors import DistTimeoutError

    with pytest.raises(DistTimeoutError) as info:
        c.run("import time\ntime.sleep(60)", ranks=[5], timeout=1.0, show=False)
    assert "rank 5" in str(info.value) and "interrupted" in str(info.value)
    # had the interrupt not reached it, rank 5 would sleep on for a minute
    assert c.run("'ok'", ranks=[5], timeout=20, show=False) == {5: "'ok'"}


# -- faults, each in its own world (the module's world is stopped first) ---------------------
@pytest.fixture
def own(fakehosts):
    """Fake hosts with no world running; the agents are ended after the test."""
    nbdist.stop()
    try:
        yield fakehosts
    finally:
        nbdist.stop()
        nbdist.release_hosts()

def test_a_killed_host_is_noticed_its_ranks_fail_fast_and_restart_relaunches_it(own):
    fh = own
    c = _start(fh)
    try:
        agent = c._world.agents[fh.ns["b"]]
        os.kill(agent.proc.pid, signal.SIGKILL)  # `ip netns exec` exec'd: this is the agent
        t0 = time.monotonic()
        wait_until(lambda: not c.ranks[4].alive and not c.ranks[5].alive, 5.0,
                   "ranks 4 and 5 to be marked dead after their host's agent was killed")
        assert time.monotonic() - t0 < 5.0
        assert fh.ns["b"] in c.ranks[4].reason()
        row = [ln for ln in str(c.status()).splitlines() if ln.startswith("4 ")][0]
        assert fh.ns["b"] in row and "lost" in row
        t0 = time.monotonic()
        with pytest.raises(WorkerDiedError) as info:
            rpc.rpc_sync(c.names[4], os.getpid)
        assert time.monotonic() - t0 < 10.0
        assert "rank 4" in str(info.value) and fh.ns["b"] in str(info.value)
        wait_until(lambda: not _pids_in(fh, "b"), 5.0, "nothing left running on host b")
        assert c.run("1", ranks=[2], show=False) == {2: "1"}  # the other host is fine
        c = c.restart()
        assert all(c.ranks[r].alive for r in range(6))
        assert rpc.rpc_sync(c.names[5], where)[0] == _netns_inode(fh.ns["b"])
    finally:
        c.stop()


def test_a_link_down_is_a_host_lost_and_its_agent_ends_its_ranks(own):
    fh = own
    c = _start(fh)
    try:
        fh.link("a", up=False)
        t0 = time.monotonic()
        wait_until(lambda: not c.ranks[2].alive, 15.0,
                   "rank 2 marked dead after its link went down")
        # SILENCE is 4 s after the last heartbeat: within 5 s, plus slack for a loaded machine
        assert time.monotonic() - t0 < 7.0
        assert "heartbeat" in c.ranks[2].reason()
        wait_until(lambda: not _pids_in(fh, "a"), AGENT_SILENCE + 10.0,
                   "the agent on host a (cut off) to end its ranks and exit")
    finally:
        fh.link("a", up=True)
        c.stop()


def test_stop_leaves_nothing_on_any_host(own):
    fh = own
    c = _start(fh)
    pids = {h: _pids_in(fh, h) for h in ("a", "b")}
    assert all(pids.values())
    c.stop()
    nbdist.release_hosts()
    for h in ("a", "b"):
        wait_until(lambda h=h: not _pids_in(fh, h), 5.0, f"host {h} to be empty after stop")


def test_a_notebook_killed_by_sigkill_leaves_nothing_on_any_host(own, tmp_path):
    fh = own
    script = tmp_path / "nb.py"
    script.write_text(textwrap.dedent(f"""
        import nbdist, sys
        c = nbdist.start(0, hosts={{{fh.ns['a']!r}: 1, {fh.ns['b']!r}: 1}}, iface={fh.address!r},
                         launcher={fh.launcher!r}, quiet=True)
        print("READY", flush=True)
        sys.stdin.read()
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "READY", proc.stderr.read()
        assert _pids_in(fh, "a") and _pids_in(fh, "b")
        proc.kill()
        proc.wait(10)
        for h in ("a", "b"):
            wait_until(lambda h=h: not _pids_in(fh, h), 5.0,
                       f"host {h} to be empty after the notebook was SIGKILLed")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_failing_launcher_gives_its_command_and_stderr(own):
    fh = own
    launcher = "sh -c 'echo no route to {host} >&2; exit 255' {command}"
    t0 = time.monotonic()
    with pytest.raises(StartError) as info:
        nbdist.start(0, hosts={"nowhere": 1}, iface=fh.address, launcher=launcher, quiet=True,
                     start_timeout=30)
    assert time.monotonic() - t0 < 30
    text = str(info.value)
    assert "no route to nowhere" in text and "exited with code 255" in text
    assert "nbdist.join" in text  # the command it ran


def test_standins_for_ssh_and_srun_get_the_documented_command_line(own, tmp_path,
                                                                  monkeypatch):
    fh = own
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "argv.log"
    # each stand-in logs its argv, then runs the command "on" the host: the namespace
    (bindir / "ssh").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "ssh $*" >> {log}
        host="$3"; shift 3
        exec ip netns exec "$host" sh -c "$*"
    """))
    (bindir / "srun").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "srun $*" >> {log}
        host="${{3#--nodelist=}}"; shift 3
        exec ip netns exec "$host" "$@"
    """))
    for f in ("ssh", "srun"):
        (bindir / f).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    for launcher, host in (("ssh", "a"), ("srun", "b")):
        c = nbdist.start(0, hosts={fh.ns[host]: 1}, iface=fh.address, launcher=launcher,
                         quiet=True)
        try:
            assert rpc.rpc_sync(c.names[1], where)[0] == _netns_inode(fh.ns[host])
        finally:
            c.stop()
    nbdist.release_hosts()
    lines = log.read_text().splitlines()
    assert lines == [
        f"ssh -o BatchMode=yes {fh.ns['a']} {sys.executable} -m nbdist.join",
        f"srun --nodes=1 --ntasks=1 --nodelist={fh.ns['b']} {sys.executable} -m nbdist.join",
    ]


def test_a_local_world_after_a_host_world_listens_on_loopback_only(own):
    """torch fixes rank 0's TensorPipe address per process; nbdist re-pins it each world."""
    from nbdist.patches import tp_address

    fh = own
    c = nbdist.start(0, hosts={fh.ns["a"]: 1}, iface=fh.address, launcher=fh.launcher,
                     quiet=True)
    try:
        assert tp_address.current() == fh.address
    finally:
        c.stop()
    c = nbdist.start(1, quiet=True)
    try:
        assert tp_address.current() == "127.0.0.1"
        addrs = {a.rsplit(":", 1)[0] for a in _listeners_of_our_processes()}
        assert addrs and addrs <= {"127.0.0.1"}, addrs
        assert rpc.rpc_sync(c.names[1], os.getpid) == c.ranks[1].pid
    finally:
        c.stop()


def test_process_group_logs_and_tracing_span_hosts(own):
    fh = own
    c = _start(fh, process_group="gloo")
    try:
        code = ("import torch, torch.distributed as dist, nbdist\n"
                "t = torch.tensor([float(dist.get_rank())])\n"
                "dist.all_reduce(t)\n"
                "nbdist.log(total=t.item())\n"
                "t.item()")
        exec_id = c.send_cell(code, list(range(1, 6)))
        ns: dict = {}
        exec(code, ns)  # rank 0 takes part in the collective, as `%%dist --local` does
        results = c.report(c.collect(exec_id, list(range(1, 6)), 60), list(range(1, 6)),
                           show=False)
        assert ns["t"].item() == 15.0 and set(results.values()) == {"15.0"}
        c.flush()
        logged = {r["rank"] for r in nbdist.history(key="total")}
        assert {1, 2, 3, 4, 5} <= logged
        nbdist.rpc_stats()  # tracing on: calls to every host are counted
        for r in (2, 4):
            rpc.rpc_sync(c.names[r], os.getpid)
        stats = str(nbdist.rpc_stats())
        assert c.names[2] in stats and c.names[4] in stats
    finally:
        c.stop()
        nbdist.clear_history()


def test_a_module_the_host_lacks_is_named_with_the_host(own, tmp_path, monkeypatch):
    """A module importable here only (by reference) fails on the remote host by name."""
    fh = own
    pkg = tmp_path / "onlyhere_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def answer():\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import onlyhere_pkg

    c = nbdist.start(0, hosts={fh.ns["a"]: 1}, iface=fh.address, launcher=fh.launcher,
                     quiet=True)
    try:
        os.rename(pkg, tmp_path / "moved_pkg")  # gone from the shared filesystem
        with pytest.raises(Exception) as info:
            rpc.rpc_sync(c.names[1], onlyhere_pkg.answer)
        text = str(info.value)
        assert "onlyhere_pkg" in text and fh.ns["a"] in text, text
    finally:
        c.stop()
        sys.modules.pop("onlyhere_pkg", None)


def test_an_impostor_at_the_join_listener_is_dropped_and_the_start_goes_on(own, tmp_path,
                                                                           capfd):
    """A process that reaches the join listener with a wrong secret (it ignores the one on its
    stdin): refused before anything is unpickled, logged, and the real agent still joins."""
    fh = own
    verdict = tmp_path / "verdict"
    impostor = tmp_path / "impostor.py"
    impostor.write_text(textwrap.dedent(f"""
        import json, sys
        from nbdist.control.channel import HandshakeError, connect
        request = json.loads(sys.argv[1])
        try:
            connect(tuple(request["address"]), b"guessed" * 5, timeout=10)
            result = "accepted"
        except HandshakeError:
            result = "rejected"
        open({str(verdict)!r}, "w").write(result)
    """))
    launcher = tmp_path / "launch.sh"
    launcher.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        host="$1"; shift
        read -r line
        {sys.executable} {impostor} "$line"
        printf '%s\\n' "$line" | exec ip netns exec "$host" "$@"
    """))
    launcher.chmod(0o755)
    c = nbdist.start(0, hosts={fh.ns["a"]: 1}, iface=fh.address,
                     launcher=f"{launcher} {{host}} {{command}}", quiet=True)
    try:
        assert verdict.read_text() == "rejected"
        assert "dropped a connection to the join listener" in capfd.readouterr().err
        assert rpc.rpc_sync(c.names[1], where)[0] == _netns_inode(fh.ns["a"])
    finally:
        c.stop()


def test_dist_restart_after_dist_stop_keeps_the_hosts(own):
    from IPython.testing.globalipapp import get_ipython

    fh = own
    ip = get_ipython()
    ip.run_line_magic("load_ext", "nbdist")
    ip.run_line_magic("dist_start", f"1 --hosts {fh.ns['a']}:1 --iface {fh.address} "
                                    f"--launcher '{fh.launcher}' --remote-python {sys.executable}")
    before = nbdist.current().spec
    ip.run_line_magic("dist_stop", "")
    ip.run_line_magic("dist_restart", "")
    c = nbdist.current()
    assert c.spec == before and c.world_size == 3
    assert rpc.rpc_sync(c.names[2], where)[0] == _netns_inode(fh.ns["a"])


def test_keep_restart_across_hosts_replaces_a_killed_rank_and_keeps_the_rest(own, capfd):
    """Issue 18 across machines: rank 4 on host b is killed; `restart(keep=True)` forks it
    again through b's agent while every other rank, on every host, keeps its process and
    variables, and the world rendezvouses through a fresh store."""
    fh = own
    c = _start(fh)
    try:
        c.run("import os\nmarker = os.getpid()", show=False)
        before = {r: c.ranks[r].pid for r in range(1, 6)}
        old_store = c._world.store.address
        os.kill(before[4], signal.SIGKILL)  # same pid namespace: the ranks are our own kin
        wait_until(lambda: not c.ranks[4].alive, 10.0, "rank 4 to be marked dead")
        assert c.restart(keep=True, quiet=True) is c
        assert c._world.store.address != old_store  # a fresh store, the old one closed
        got = c.run("globals().get('marker')", show=False)
        assert got == {1: str(before[1]), 2: str(before[2]), 3: str(before[3]), 4: None,
                       5: str(before[5])}
        assert rpc.rpc_sync(c.names[4], where)[0] == _netns_inode(fh.ns["b"])
        assert rpc.rpc_sync(c.names[2], os.getpid) == before[2]
        c.stop()
        # the kept ranks closed their connections to the old store when they rejoined, and
        # the rest at stop: none was left to the collector ("ResourceWarning: unclosed socket")
        out = capfd.readouterr()
        assert "unclosed" not in out.out + out.err, out
    finally:
        c.stop()
