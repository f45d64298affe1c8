"""The stderr filter drops exactly torch's nbdist-caused noise and passes the rest."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

import pytest
from conftest import wait_until

from nbdist.patches.quiet import MAX_PARTIAL, drop_stdout_noise, filter_chunk, filter_lines

TRACE = [
    b"[E1121 09:15:33.120 rref_impl.cpp:108] Error occurred when deletingUserRRef(rref_id=G"
    b"loballyUniqueId(created_on=0, local_id=4)) : could not find destination id 3",
    b"frame #0: c10::Error::Error(c10::SourceLocation) + 0x9d (0x7f in libc10.so)",
    b"frame #1: torch::distributed::rpc::UserRRef::tryDel() + 0x79",
    b"<omitting python frames>",
    b"",
]


def test_drops_rref_trace_and_peer_closed_lines_only():
    lines = [b"user line before", *TRACE, b"user line after",
             b"[W1121 tensorpipe_agent.cpp:723] RPC agent for agent encountered error when "
             b"reading incoming request from obs1: eof (this error originated at x)",
             # over TCP (a rank on another host, a keep-restart under --ray or --slurm)
             b"[W1129 tensorpipe_agent.cpp:723] RPC agent for worker1 encountered error when "
             b"reading incoming request from worker0: EOF: end of file (this error originated "
             b"at tensorpipe/transport/uv/connection_impl.cc:132)",
             b"[W1121 something_else.cpp:1] a real torch warning"]
    keep, in_block = filter_lines(lines, False)
    assert keep == [b"user line before", b"user line after",
                    b"[W1121 something_else.cpp:1] a real torch warning"]
    assert not in_block


def test_trace_split_across_reads():
    keep1, in_block = filter_lines(TRACE[:2], False)
    assert keep1 == [] and in_block
    keep2, in_block = filter_lines([*TRACE[2:], b"next"], in_block)
    assert keep2 == [b"next"] and not in_block


def test_partial_lines_are_held_only_while_they_could_be_noise():
    text, pending, in_block = filter_chunk(b"user says hi\n[W1121 tensorpipe_age", False)
    assert (text, pending, in_block) == (b"user says hi\n", b"[W1121 tensorpipe_age", False)
    text, pending, _ = filter_chunk(pending + b"nt.cpp:7] encountered error eof\nok", False)
    assert (text, pending) == (b"ok", b"")  # the noise line dropped, "ok" passed on at once


def test_a_huge_unfinished_line_passes_through_in_pieces():
    held = b""
    out = b""
    for _ in range(40):  # 40 x 4 KB of one line that starts like torch's log lines
        out_piece, held, _ = filter_chunk(held + (b"[" + b"x" * 4095), False)
        out += out_piece
        assert len(held) <= MAX_PARTIAL
    assert len(out) + len(held) == 40 * 4096 and out.startswith(b"[x")


def test_drops_gloos_connection_lines_from_a_workers_stdout_only():
    """torch 2.10 (and older) prints one on stdout each time a rank joins a Gloo group,
    sometimes in pieces."""
    gloo = "[Gloo] Rank 2 is connected to 3 peer ranks. Expected number of connected peer " \
           "ranks is : 3\n"
    assert drop_stdout_noise("a\n" + gloo + "b\n" + gloo) == ("a\nb\n", "")
    said = "print('[Gloo] Rank 2 is connected')\n"
    assert drop_stdout_noise(said) == (said, "")
    assert drop_stdout_noise("x " + gloo) == ("x " + gloo, "")  # only whole lines
    out, held = "", ""
    for piece in ("a\n[Gl", gloo[3:40], gloo[40:], "b"):
        sent, held = drop_stdout_noise(piece, held)
        out += sent
    assert (out, held) == ("a\nb", "")
    assert drop_stdout_noise("no newline yet") == ("no newline yet", "")


def test_drops_the_lines_a_world_ending_after_dist_autograd_causes():
    lines = [b"[E1124 13:30:47.944 container.cpp:250] Could not release Dist Autograd Context "
             b"on node 1: pipe closed (this error originated at tensorpipe/core/pipe_impl.cc:356)",
             b"[W1124 13:30:47.945 tensorpipe_agent.cpp:912] RPC agent for agent won't send "
             b"response to request #12 to obs1, as the agent is shutting down",
             b"[E1124 container.cpp:250] Could not release Dist Autograd Context on node 1: "
             b"a real failure",
             b"user line"]
    keep, _ = filter_lines(lines, False)
    assert keep == lines[2:]


AUTOGRAD_THEN_STOP = """
import sys, torch, nbdist
import torch.distributed.rpc as rpc
import torch.distributed.autograd as dist_autograd

def double(x):
    return x * 2

c = nbdist.start(2, quiet=True)
for _ in range(3):
    with dist_autograd.context() as ctx:
        x = torch.ones(3, requires_grad=True)
        y = rpc.rpc_sync(c.names[2], double, args=(rpc.rpc_sync(c.names[1], double, args=(x,)),))
        dist_autograd.backward(ctx, [y.sum()])
c = c.restart(quiet=True) if sys.argv[1] == "restart" else c
c.stop()
print("stopped", file=sys.stderr, flush=True)
"""


@pytest.mark.slow  # a fresh Python and a world: ~6 s each
@pytest.mark.parametrize("how", ["stop", "restart"])
def test_stop_right_after_dist_autograd_prints_nothing_of_torch(how, tmp_path):
    """Rank 0's fd 2 (what Jupyter shows in the cell) stays clean when a world ends right after
    distributed autograd: torch's context release to a closing peer is nbdist-caused noise."""
    script = tmp_path / "autograd_then_stop.py"
    script.write_text(AUTOGRAD_THEN_STOP)
    proc = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == ["stopped"], proc.stderr[-3000:]


NOISE = (b"[W1125 14:31:56.684 tensorpipe_agent.cpp:723] RPC agent for worker1 encountered "
         b"error when reading incoming request from worker0: eof (this error originated at "
         b"tensorpipe/transport/shm/connection_impl.cc:259)\n")


def test_a_workers_fd2_is_filtered_too(world):
    """What a worker writes to fd 2 reaches the notebook less torch's noise (issue 27, 5b)."""
    c = world(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        c.run(f"import os\nos.write(2, {NOISE!r} + b'a real line\\n')", ranks=1, show=False)
        wait_until(lambda: "a real line" in out.getvalue(), 10, "the worker's fd 2 line")
    assert "encountered error" not in out.getvalue(), out.getvalue()


@pytest.mark.slow  # two worlds' worth of start-up: ~5 s
def test_keep_restart_prints_no_tensorpipe_eof_per_kept_worker(world):
    """Kept workers' old RPC agents see rank 0's old pipes close: torch logs one ``eof`` line
    each to fd 2 (issue 27, 5b); none reaches the notebook."""
    c = world(2)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        c = c.restart(keep=True)
        c.run("import os\nos.write(2, b'after the rebuild\\n')", show=False)
        wait_until(lambda: out.getvalue().count("after the rebuild") == 2, 10,
                   "both workers' fd 2 lines after the rebuild")
    assert "kept state: 1, 2" in out.getvalue(), out.getvalue()
    assert "encountered error" not in out.getvalue(), out.getvalue()


JOIN = '''
import torch, torch.distributed as dist
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

class Inputs(Joinable):  # the least a Joinable is: a hook, a device, a group
    def __init__(self):
        super().__init__()
    def join_hook(self, **kwargs):
        return JoinHook()
    @property
    def join_device(self):
        return torch.device("cpu")
    @property
    def join_process_group(self):
        return dist.group.WORLD

with Join([Inputs()]):  # its __exit__ calls warnings.simplefilter("once") for the whole process
    pass
'''

AFTER_JOIN = '''
import warnings, torch
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2
torch.jit.script(twice)  # warns "`torch.jit.script` is deprecated"
warnings.warn("a warning of my own")
'''


@pytest.mark.slow  # a world with a process group, and TorchScript: ~10 s
def test_torch_join_does_not_bring_back_the_hidden_warnings(ipython):
    """torch's ``Join.__exit__`` resets the warning filters of the process (issue 27, 5c):
    the TorchScript deprecation stays hidden on the workers; the user's own warning shows."""
    ipython.run_line_magic("dist_start", "1 --process-group gloo")
    ipython.run_cell_magic("dist", "--local", JOIN)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        ipython.run_cell_magic("dist", "", AFTER_JOIN)
    assert "[worker1]" in out.getvalue() and "a warning of my own" in out.getvalue(), \
        out.getvalue()
    assert "deprecated" not in out.getvalue(), out.getvalue()
