"""Every patch feature installs and uninstalls: after all are uninstalled, torch's and
cloudpickle's attributes are the very objects they were; and nbdist's pickling cache serves
nbdist's pickler only, so plain cloudpickle in the same process pickles as it does alone.
Each runs in a fresh process (patches are per process)."""

from __future__ import annotations

import json
import subprocess
import sys

ROUND_TRIP = r'''
import json, sys
import cloudpickle, cloudpickle.cloudpickle
import torch, torch.distributed as dist, torch.multiprocessing, torch.multiprocessing.spawn
import torch.distributed.rpc as rpc
from torch._C._distributed_rpc import PyRRef
from torch.distributed import distributed_c10d as c10d
from torch.distributed.rpc import api, backend_registry, constants, internal, rref_proxy

OWNERS = {"rpc": rpc, "api": api, "internal": internal, "rref_proxy": rref_proxy,
          "backend_registry": backend_registry, "constants": constants, "dist": dist,
          "c10d": c10d, "mp": torch.multiprocessing, "mp.spawn": torch.multiprocessing.spawn,
          "cloudpickle": cloudpickle, "cloudpickle.cloudpickle": cloudpickle.cloudpickle,
          "rpc pickler": internal._internal_rpc_pickler, "PyRRef": PyRRef}

def snapshot():
    return {k: dict(vars(v)) for k, v in OWNERS.items()}

def changed(before):
    now = snapshot()
    return sorted(f"{k}.{a}" for k in OWNERS for a in set(before[k]) | set(now[k])
                  if before[k].get(a, before) is not now[k].get(a, now))

torch_own = snapshot()
from nbdist.patches import no_rpc, process_group, rpc_hooks, rpc_rerun, thread_states
from nbdist.shipping import pickler
from nbdist.patches import mp_spawn as patch
from nbdist.telemetry import tracing
out = {"import": changed(torch_own)}
features = [  # install order, as a world's start has it (then reversed to uninstall)
    ("shipping", pickler.install, pickler.uninstall),
    ("thread_states", thread_states.install, thread_states.uninstall),
    ("caller", rpc_hooks.install_caller, rpc_hooks.uninstall_caller),
    ("callee", rpc_hooks.install_callee, rpc_hooks.uninstall_callee),
    ("tracing", lambda: tracing.install(0, "agent"), tracing.uninstall),
    ("rerun", rpc_rerun.install, rpc_rerun.uninstall),
    ("spawn", patch.install, patch.uninstall),
    ("process_group", process_group.install, process_group.uninstall),
    ("no_rpc", lambda: no_rpc.enter(no_rpc.FLAG), no_rpc.leave),
]
out["each"] = {}
for name, install, _ in features:
    before = snapshot()
    install()
    out["each"][name] = changed(before)
out["installed"] = changed(torch_own)
out["one_layer"] = api.rpc_sync.__wrapped__ is torch_own["api"]["rpc_sync"]
out["one_send_wrapper"] = [getattr(api, n).__wrapped__ is torch_own["api"][n]
                           for n in ("_invoke_rpc_python_udf", "_invoke_remote_python_udf")]
before = snapshot()
out["shipping_out"] = pickler.uninstall()  # out first: tracing still watches the sends
out["shipping_out_changed"] = changed(before)
out["left"] = {}
for name, _, uninstall in reversed(features):
    out["left"][name] = uninstall()
out["after"] = changed(torch_own)
for name, install, _ in features:  # and once more: an uninstalled feature installs again
    install()
out["again"] = changed(torch_own) == out["installed"]
print(json.dumps(out))
'''


def _run(script: str) -> dict:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_every_feature_uninstalls_to_torchs_and_cloudpickles_own_objects():
    out = _run(ROUND_TRIP)
    assert out["import"] == []  # importing nbdist's patches changes nothing
    for name, replaced in out["each"].items():
        assert replaced, f"{name} replaced nothing: this test would not see it come back"
    # rpc_sync is wrapped once, for the caller and tracing both
    assert "api.rpc_sync" in out["each"]["caller"]
    assert "api.rpc_sync" not in out["each"]["tracing"]
    assert out["one_layer"]  # ... and over torch's own: no wrapper between
    assert "rpc pickler.serialize" in out["each"]["shipping"]
    assert "PyRRef.to_here" in out["each"]["tracing"]
    # the Python-UDF sends are wrapped once, for shipping and tracing both, by the first
    sends = ["api._invoke_remote_python_udf", "api._invoke_rpc_python_udf"]
    assert set(sends) <= set(out["each"]["shipping"])
    assert not set(sends) & set(out["each"]["tracing"])
    assert out["one_send_wrapper"] == [True, True]
    # shipping uninstalled before tracing: its own two back, the sends still wrapped
    assert out["shipping_out"] == []
    assert out["shipping_out_changed"] == ["api._to_worker_info", "rpc pickler.serialize"]
    assert out["left"] == {name: [] for name in out["each"]}
    assert out["after"] == [], "left replaced after every uninstall"
    assert out["again"]


PLAIN = r'''
import json, os, sys
import cloudpickle, cloudpickle.cloudpickle

def uses_a_submodule(x):
    return os.path.join(x, "a")

def plain():
    return cloudpickle.dumps(uses_a_submodule).hex(), \
        id(cloudpickle.cloudpickle._find_imported_submodules)

out = {"alone": plain()}
import nbdist
from nbdist.shipping import pickler
out["imported"] = plain()
pickler.install()
pickler.dumps(uses_a_submodule)  # nbdist's pickler in use: its cache filled
pickler.dumps(uses_a_submodule)
out["in_use"] = plain()
print(json.dumps(out))
'''


def test_plain_cloudpickle_pickles_the_same_beside_nbdist():
    """Ray or Dask in the same kernel pickle through cloudpickle's own functions, not
    nbdist's cache: the same function object and the same bytes before ``import nbdist``,
    after it, and while nbdist's pickler is in use."""
    out = _run(PLAIN)
    assert out["imported"] == out["alone"]
    assert out["in_use"] == out["alone"]


def test_the_gloo_bound_holds_inside_and_torchs_timeout_comes_back():
    from datetime import timedelta

    import pytest
    from torch.distributed.rpc import constants

    from nbdist.patches import gloo_timeout

    torch_own = constants.DEFAULT_PROCESS_GROUP_TIMEOUT
    with gloo_timeout.bounded(7.0):
        assert constants.DEFAULT_PROCESS_GROUP_TIMEOUT == timedelta(seconds=7)
    assert constants.DEFAULT_PROCESS_GROUP_TIMEOUT is torch_own
    with pytest.raises(RuntimeError), gloo_timeout.bounded(3.0):
        raise RuntimeError("a join that failed")
    assert constants.DEFAULT_PROCESS_GROUP_TIMEOUT is torch_own
