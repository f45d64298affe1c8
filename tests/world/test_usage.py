"""Behaviour 8: bad input gets a clear UsageError that says what to do, and starts nothing."""

from __future__ import annotations

import pytest
from conftest import start_refused
from IPython.core.error import UsageError


@pytest.mark.parametrize("line, words", [
    ("", "needs the number of workers"),
    ("0", "at least 1"),
    ("-2", "at least 1"),
    ("abc", "whole number"),
    ("100000", "will not fit"),
    ("2 --bogus", "unrecognized arguments: --bogus"),
    ("2 --threads", "expected one argument"),
    ("2 --threads 0", "positive whole number"),
    ("2 --rpc-timeout -1", "positive number of seconds"),
    ("2 --process-group mpi", "invalid choice"),
    ("2 --worker-name obs", "has no {rank}"),
    ("2 --worker-name 'obs {rank}'", "invalid name"),
    ("2 --name obs1 --worker-name obs{rank}", "duplicate name 'obs1'"),
    ("2 --worker-name obs{rank}{x}", "not a valid pattern"),
    ("2 --name \"unclosed", "No closing quotation"),
    ("1 --hosts a:2", "needs --iface"),
    ("1 --hosts a:2 --iface 0.0.0.0", "not every interface"),
    ("1 --hosts a:2 --iface nosuch0", "is not an interface or IPv4 address"),
    ("1 --hosts a:x --iface lo", "not a number of ranks"),
    ("1 --hosts a:0 --iface lo", "at least one rank"),
    ("1 --hosts a:1,a:2 --iface lo", "named twice"),
    ("1 --hosts 'bad host:1' --iface lo", "invalid host"),
    ("1 --hosts a:1 --iface lo --launcher 'echo {host}'", "with {host} and {command}"),
    ("0 --hosts slurm --iface lo", "not inside a SLURM allocation"),
])
def test_bad_dist_start_says_what_to_do_and_starts_nothing(ipython, line, words):
    assert words in start_refused(ipython, line)


def test_size_beyond_machine_says_why(ipython):
    with pytest.raises(UsageError) as info:
        ipython.run_line_magic("dist_start", "100000")
    msg = str(info.value)
    assert "MB" in msg and "available" in msg and "at most" in msg


def test_no_world_errors(ipython, monkeypatch):
    from nbdist.cluster.session import session

    monkeypatch.setattr(session(), "last_spec", None)  # as in a fresh kernel
    with pytest.raises(UsageError, match="no nbdist world is running"):
        ipython.run_cell_magic("dist", "", "1")
    with pytest.raises(UsageError, match="no nbdist world is running"):
        ipython.run_line_magic("dist_status", "")
    with pytest.raises(UsageError, match="no world to restart"):
        ipython.run_line_magic("dist_restart", "")


def test_start_while_running_points_to_restart(ipython):
    ipython.run_line_magic("dist_start", "1")
    with pytest.raises(UsageError, match="%dist_restart"):
        ipython.run_line_magic("dist_start", "2")


@pytest.mark.parametrize("spec, words", [
    ("7", "no rank 7"), ("obs9", "unknown rank or name 'obs9'"), ("0", "rank 0 is the notebook"),
    ("2-1", "runs backwards"), ("", "selects no worker"),
])
def test_bad_ranks(ipython, spec, words):
    ipython.run_line_magic("dist_start", "2")
    with pytest.raises(UsageError, match=words):
        ipython.run_cell_magic("dist", f"--ranks '{spec}'", "1")


def test_bad_dist_flags(ipython):
    ipython.run_line_magic("dist_start", "1")
    with pytest.raises(UsageError, match="--timeout must be a positive"):
        ipython.run_cell_magic("dist", "--timeout 0", "1")
    with pytest.raises(UsageError, match="unrecognized arguments"):
        ipython.run_cell_magic("dist", "--nope", "1")


def test_python_api_raises_value_error_with_same_words():
    import nbdist

    with pytest.raises(ValueError, match="at least 1"):
        nbdist.start(0)
    with pytest.raises(ValueError, match="whole number"):
        nbdist.start("3")  # type: ignore[arg-type]
