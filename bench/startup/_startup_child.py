"""Bench-only child processes for ``bench/startup/startup.py``; one measurement per process.

``python bench/startup/_startup_child.py MODE N`` prints one line ``RESULT {json}`` on stdout:

- ``nbdist N``: a fresh "notebook" process: ``import torch`` (timed on its own), ``import
  nbdist``, then ``nbdist.start(N, quiet=True)`` with no template running yet (cold start).
- ``mp N``: the parent has imported torch; timed from there: ``torch.multiprocessing`` spawns
  N children (start method spawn) that import torch and ``init_rpc`` through a ``file://``
  store in a temporary directory; the parent is rank 0 and ``rpc_sync``s every child once.
- ``ipp N``: ``ipyparallel`` imported; timed from there: ``ipp.Cluster(n=N)
  .start_and_connect_sync()`` then ``rc[:].execute('import torch', block=True)``.
- ``ipp-serve N``: starts an ipyparallel cluster of N engines, then answers commands read from
  stdin, one per line: ``api K`` / ``magic K`` run ``rc[:].execute('x=1', block=True)`` /
  ``%px x=1`` (through an IPython shell) K times and print ``TIMES [seconds...]``; ``quit``.

Every mode cleans up what it started in ``finally``; the parent also kills any process left
behind. Top-level imports stay in the standard library: spawned ``mp`` children import this
module again as ``__mp_main__``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

T_PROC = time.perf_counter()


def _emit(kind: str, payload: object) -> None:
    sys.stdout.write(f"{kind} {json.dumps(payload)}\n")
    sys.stdout.flush()


def _tree_cpu() -> float:
    sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    import _common

    return _common.tree_cpu()


# ----------------------------------------------------------------------------- nbdist
def run_nbdist(n: int) -> dict:
    t0 = time.perf_counter()
    import torch  # the notebook's own first cell

    t1 = time.perf_counter()
    import nbdist

    t2 = time.perf_counter()
    sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    import _startup_phases as phases

    phases.install()
    cpu0 = _tree_cpu()
    t3 = time.perf_counter()
    cluster = nbdist.start(n, quiet=True)
    t4 = time.perf_counter()
    cpu1 = _tree_cpu()
    try:
        pids = cluster.worker_pids()
        assert len(pids) == n, pids
        assert all(cluster.ranks[r].ready for r in cluster.ranks)
        out = {"import_torch": t1 - t0, "import_nbdist": t2 - t1, "start": t4 - t3,
               "startup_seconds": cluster.startup_seconds, "cpu": cpu1 - cpu0,
               "phases": phases.breakdown(t3), "torch": torch.__version__,
               "nbdist_file": nbdist.__file__}
    finally:
        t5 = time.perf_counter()
        cluster.stop()
        out_stop = time.perf_counter() - t5
        from nbdist.cluster.session import session
        _cl = session()

        if _cl.template is not None:
            _cl.template.close()
    out["stop"] = out_stop
    return out


# ----------------------------------------------------------------------------- mp spawn
def _mp_worker(index: int, world_size: int, init_method: str) -> None:
    import torch  # noqa: F401
    import torch.distributed.rpc as rpc

    rank = index + 1
    opts = rpc.TensorPipeRpcBackendOptions(init_method=init_method, rpc_timeout=120)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size, rpc_backend_options=opts)
    rpc.shutdown()  # graceful: waits until rank 0 is done with everyone


def run_mp(n: int) -> dict:
    import torch  # the notebook has imported torch already (untimed, as for nbdist)

    os.environ.update({"TP_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"})  # as nbdist does
    tmp = tempfile.mkdtemp(prefix="nbdist-bench-mp-")
    init = f"file://{tmp}/rpc"
    cpu0 = _tree_cpu()
    t0 = time.perf_counter()
    import torch.distributed.rpc as rpc
    import torch.multiprocessing as mp

    ctx = mp.start_processes(_mp_worker, args=(n + 1, init), nprocs=n, join=False,
                             start_method="spawn")
    rpc_up = False
    try:
        opts = rpc.TensorPipeRpcBackendOptions(init_method=init, rpc_timeout=120)
        rpc.init_rpc("worker0", rank=0, world_size=n + 1, rpc_backend_options=opts)
        rpc_up = True
        t1 = time.perf_counter()
        pids = [rpc.rpc_sync(f"worker{r}", os.getpid) for r in range(1, n + 1)]
        t2 = time.perf_counter()
        cpu1 = _tree_cpu()
        assert len(set(pids)) == n and os.getpid() not in pids, pids
        t3 = time.perf_counter()
        rpc.shutdown()
        rpc_up = False
        ctx.join(60)
        stop = time.perf_counter() - t3
    finally:
        if rpc_up:
            rpc.shutdown(graceful=False)
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join(5)
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return {"start": t2 - t0, "init_rpc": t1 - t0, "ping": t2 - t1, "cpu": cpu1 - cpu0,
            "stop": stop, "torch": torch.__version__}


# ----------------------------------------------------------------------------- ipyparallel
def _ipp_start(n: int) -> tuple:
    import ipyparallel as ipp

    cluster = ipp.Cluster(n=n, log_level=40)  # engines and controller on localhost
    rc = None
    try:
        rc = cluster.start_and_connect_sync()
        if len(rc.ids) != n:
            raise RuntimeError(f"ipyparallel: {len(rc.ids)} engines of {n} connected")
    except BaseException:
        _ipp_stop(cluster, rc)
        raise
    return cluster, rc


def _ipp_stop(cluster: object, rc: object) -> None:
    try:
        if rc is not None:
            rc.close()  # type: ignore[attr-defined]
    finally:
        cluster.stop_cluster_sync()  # type: ignore[attr-defined]


def run_ipp(n: int) -> dict:
    import ipyparallel  # noqa: F401  (the notebook imported it; untimed)

    cpu0 = _tree_cpu()
    t0 = time.perf_counter()
    cluster, rc = _ipp_start(n)
    try:
        t1 = time.perf_counter()
        rc[:].execute("import torch", block=True)
        t2 = time.perf_counter()
        cpu1 = _tree_cpu()
    finally:
        t3 = time.perf_counter()
        _ipp_stop(cluster, rc)
        stop = time.perf_counter() - t3
    return {"start": t2 - t0, "connect": t1 - t0, "import_torch": t2 - t1, "cpu": cpu1 - cpu0,
            "stop": stop}


def serve_ipp(n: int) -> None:
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    cfg = Config()
    cfg.HistoryManager.hist_file = ":memory:"  # nothing written to IPYTHONDIR
    shell = InteractiveShell.instance(config=cfg)
    cluster, rc = _ipp_start(n)
    try:
        view = rc[:]
        view.block = True
        view.activate()  # registers %px on the shell
        _emit("READY", {"engines": len(rc.ids)})
        for line in sys.stdin:
            cmd, *rest = line.split()
            if cmd == "quit":
                break
            k = int(rest[0])
            times = []
            for _ in range(k):
                t = time.perf_counter()
                if cmd == "api":
                    view.execute("x=1", block=True)
                else:
                    res = shell.run_cell("%px x=1", store_history=False)
                    if not res.success:
                        raise RuntimeError(f"%px failed: {res.error_in_exec!r}")
                times.append(time.perf_counter() - t)
            _emit("TIMES", times)
    finally:
        _ipp_stop(cluster, rc)


def main(argv: list[str]) -> int:
    mode, n = argv[0], int(argv[1])
    if mode == "ipp-serve":
        serve_ipp(n)
        return 0
    fn = {"nbdist": run_nbdist, "mp": run_mp, "ipp": run_ipp}[mode]
    out = fn(n)
    out.update(mode=mode, n=n, pid=os.getpid(), proc_to_result=time.perf_counter() - T_PROC)
    _emit("RESULT", out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
