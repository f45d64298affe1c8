"""``%load_ext nbdist`` starts the warm template in the background, unless NBDIST_PREWARM=0."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import wait_gone

CHILD = r'''
import json, sys, time
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config
from nbdist.cluster.session import session
cfg = Config()
cfg.HistoryManager.hist_file = ":memory:"
shell = InteractiveShell.instance(config=cfg)
t0 = time.perf_counter()
shell.run_line_magic("load_ext", "nbdist")
returned = time.perf_counter() - t0
pid = session().template_pid()
ready = session().template is not None and session().template._ready.is_set()
out = {"returned_s": returned, "template_pid": pid, "template_ready_on_return": ready}
if pid is not None and sys.argv[1] == "start":
    shell.run_line_magic("dist_start", "2")
    out["ran"] = shell.run_cell("%%dist\nprint('hi')\n").success
    shell.run_line_magic("dist_stop", "")
print("RESULT " + json.dumps(out), flush=True)
'''


def run_child(env_value: str | None, what: str = "look") -> dict:
    env = dict(os.environ)
    env.pop("NBDIST_PREWARM", None)
    if env_value is not None:
        env["NBDIST_PREWARM"] = env_value
    proc = subprocess.run([sys.executable, "-c", CHILD, what], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.slow  # a fresh Python, IPython and a two-rank world: ~5 s
def test_load_ext_starts_the_template_and_returns_at_once():
    out = run_child(None, "start")
    assert out["template_pid"] is not None
    # it does not wait for the template's torch import: the template was not ready yet when
    # it returned (a comparison with the template's own start, not a wall-clock figure)
    assert out["template_ready_on_return"] is False, out
    assert out["ran"] is True
    assert not wait_gone([out["template_pid"]], 15.0)  # it exited with its notebook


def test_prewarm_off():
    for value in ("0", "off"):
        out = run_child(value)
        assert out["template_pid"] is None


ENV_CHILD = r'''
import json, os, sys
import nbdist
from nbdist.cluster.session import session
nbdist.start(1, quiet=True).stop()  # the template is warm, imported under the old values
first = session().template_pid()
CHECK = ("import os, logging\n(os.environ.get('TORCH_LOGS'), os.environ.get('NBDIST_TEST_PLAIN'),"
         " logging.getLogger('torch._dynamo').getEffectiveLevel())")
os.environ["NBDIST_TEST_PLAIN"] = "plain"  # read when used: a fork sees it as it is
c = nbdist.start(1)  # nothing changed that torch reads at import: the same template
plain = c.run(CHECK, show=False)[1]
same = session().template_pid() == first
c.stop()
os.environ["TORCH_LOGS"] = "dynamo"  # read at import torch, as `%env TORCH_LOGS=dynamo` does
print("SAY", flush=True)
c = nbdist.start(1)
logs = c.run(CHECK, show=False)[1]
c.stop()
print("RESULT " + json.dumps({"plain": plain, "same": same, "logs": logs,
                              "rewarmed": session().template_pid() != first}), flush=True)
'''


@pytest.mark.slow  # a fresh Python and two template imports of torch: ~10 s
def test_a_variable_torch_reads_at_import_reaches_workers_of_a_warm_template():
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_LOGS", "NBDIST_TEST_PLAIN")}
    proc = subprocess.run([sys.executable, "-c", ENV_CHILD], env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert out["same"] and out["plain"] == "(None, 'plain', 30)", out
    assert out["rewarmed"] and out["logs"] == "('dynamo', 'plain', 20)", out
    said = proc.stdout.split("SAY", 1)[1]
    assert said.count("TORCH_LOGS changed since the worker template imported torch") == 1, said


def test_import_sklearn_keeps_the_warm_template(world, monkeypatch):
    """``import sklearn`` sets ``KMP_DUPLICATE_LIB_OK`` and ``KMP_INIT_AT_FORK``, which torch's
    OpenMP does not read at import: the next restart still forks from the warm template
    (issue 27, 5d: it started a fresh one, 2.3 s instead of 0.2 s)."""
    from nbdist.cluster.session import session

    for name in ("KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"):
        monkeypatch.delenv(name, raising=False)
    c = world(1)
    first = session().template_pid()
    import sklearn  # noqa: F401 - sets them, the first time this process imports it

    monkeypatch.setenv("KMP_DUPLICATE_LIB_OK", os.environ.get("KMP_DUPLICATE_LIB_OK", "True"))
    monkeypatch.setenv("KMP_INIT_AT_FORK", os.environ.get("KMP_INIT_AT_FORK", "FALSE"))
    c = c.restart(quiet=True)
    assert session().template_pid() == first
    assert c.run("1", show=False) == {1: "1"}
