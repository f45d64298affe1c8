"""Issue 12: debug a rank from the notebook — post-mortem and breakpoint() on workers.

A real kernel through jupyter_client with stdin enabled: each ``input_request`` the kernel
sends (pdb's prompt in the notebook's input box) is answered with the next scripted line.
"""

from __future__ import annotations

import time

import pytest
from kernel_helpers import Kernel, kernel_with_world

pytestmark = pytest.mark.kernel

START = "%load_ext nbdist\n%dist_start 2\nimport nbdist, torch.distributed.rpc as rpc"


@pytest.fixture(scope="module")
def kernel():
    yield from kernel_with_world(START)


@pytest.fixture(scope="module")
def kernel_no_rpc():
    """The same in a world without RPC (``--no-rpc``): debugging travels on the control
    channel, so what does not call RPC works there as well."""
    yield from kernel_with_world(START.replace("%dist_start 2", "%dist_start 2 --no-rpc"))


@pytest.fixture(scope="module", params=["kernel", "kernel_no_rpc"])
def any_kernel(request):
    """Each world kind's kernel in turn (module-scoped, so it is up before a test's leak
    guard looks at the processes)."""
    return request.getfixturevalue(request.param)


_run = Kernel.run_answering


def test_post_mortem_inspects_the_failing_frame_and_its_caller(any_kernel):
    kernel = any_kernel
    out, _, status = _run(kernel, "%%dist --ranks 2\n"
                                  "def scale(x):\n    y = x * 2\n    raise ValueError(y)\n"
                                  "outer = 'caller frame'\nscale(21)", [])
    assert status == "error" and "ValueError: 42" in out
    out, prompts, status = _run(kernel, "%dist_debug", ["p y", "p x", "up", "p outer", "q"])
    assert status == "ok", out
    assert prompts[0] == "(Pdb worker2) ", prompts
    assert "[worker2] ValueError: 42" in out  # the session says what it debugs
    assert "[worker2] 42\n" in out and "[worker2] 21\n" in out  # y and x in the failing frame
    assert "[worker2] 'caller frame'" in out  # `up` reached the cell's own frame
    assert len(prompts) == 5


def test_breakpoint_in_a_function_called_by_rpc_sync(kernel):
    _run(kernel, "def work(a):\n    b = a + 1\n    breakpoint()\n    return b * 10", [])
    out, prompts, status = _run(kernel, "print('got', rpc.rpc_sync('worker1', work, args=(4,)))",
                                ["p a, b", "c"])
    assert status == "ok", out
    assert prompts == ["(Pdb worker1) ", "(Pdb worker1) "]
    assert "[worker1] breakpoint at" in out and "[worker1] (4, 5)" in out
    assert out.rstrip().endswith("got 50")


def test_two_ranks_hitting_breakpoints_are_served_one_after_the_other(any_kernel):
    kernel = any_kernel
    out, prompts, status = _run(kernel, "%%dist\nimport os\nr = int(os.environ['NBDIST_RANK'])"
                                        "\nbreakpoint()\nr * 100",
                                ["p r", "c", "p r", "c"])
    assert status == "ok", out
    assert sorted(prompts) == ["(Pdb worker1) "] * 2 + ["(Pdb worker2) "] * 2
    assert prompts[0] == prompts[1] and prompts[2] == prompts[3]  # one session, then the other
    assert "[worker1] 1\n" in out and "[worker2] 2\n" in out
    assert "[worker1] 100" in out and "[worker2] 200" in out


def test_q_raises_in_that_worker_only(any_kernel):
    kernel = any_kernel
    out, _, status = _run(kernel, "%%dist\nimport os\n"
                                  "if os.environ['NBDIST_RANK'] == '1':\n    breakpoint()\n'done'",
                          ["q"])
    assert status == "error" and "BdbQuit" in out
    assert "[worker2] 'done'" in out


def test_interrupt_at_a_prompt_ends_the_session_and_frees_the_worker(kernel):
    def interrupt(n: int) -> bool:
        kernel.km.interrupt_kernel()
        return True

    out, prompts, status = _run(kernel, "%%dist --ranks 1\nimport time\nbreakpoint()\n"
                                        "time.sleep(0.1)\n'after'", [], on_prompt=interrupt,
                                timeout=60)
    assert status == "error" and prompts, out
    out, _, status = _run(kernel, "%%dist\n'free'", [])
    assert status == "ok" and "[worker1] 'free'" in out and "[worker2] 'free'" in out


def test_breakpoint_outside_any_cell_is_skipped_and_logged(kernel):
    _run(kernel, "%%dist --ranks 2\nimport threading\n"
                 "def later():\n    import time; time.sleep(0.5)\n    breakpoint()\n"
                 "    print('went on')\nthreading.Thread(target=later).start()", [])
    # poll rank 2's log (in the kernel) until the thread went on, 30 s at most
    out, _, status = _run(kernel, "import time\ndeadline = time.monotonic() + 30\n"
                                  "def tail():\n"
                                  "    return '\\n'.join(nbdist.current().logs(2, tail=5))\n"
                                  "while 'went on' not in tail() and time.monotonic() < deadline:\n"
                                  "    time.sleep(0.05)\n"
                                  "print(tail())", [])
    assert status == "ok"
    assert "skipped: no notebook cell is waiting" in out and "went on" in out


def test_pythonbreakpoint_0_disables_breakpoints(world):
    c = world(1)
    c.run("import os\nos.environ['PYTHONBREAKPOINT'] = '0'", show=False)
    assert c.run("breakpoint()\n'ran through'", show=False, timeout=30) == {1: "'ran through'"}


@pytest.mark.slow  # waits out the worker's attend window on purpose
def test_a_slow_first_answer_at_a_breakpoint_is_still_served(kernel):
    """The user takes longer than the worker's attend window (ATTEND_WAIT) to type at the first
    prompt: the notebook told the worker it attends, so the breakpoint is not skipped."""
    from nbdist.debugging.remote_pdb import ATTEND_WAIT

    def slow(n: int) -> bool:
        if n == 1:
            time.sleep(ATTEND_WAIT + 1.5)
        return False  # then answer as scripted

    _run(kernel, "def work2(a):\n    b = a + 1\n    breakpoint()\n    return b * 10", [])
    out, prompts, status = _run(kernel, "print('got', rpc.rpc_sync('worker1', work2, args=(4,)))",
                                ["p a, b", "c"], on_prompt=slow)
    assert status == "ok", out
    assert "skipped" not in out and "[worker1] (4, 5)" in out, out
    assert out.rstrip().endswith("got 50")
