"""A real Jupyter kernel driven through jupyter_client, for tests that need one."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil
from jupyter_client.manager import KernelManager


@dataclass
class Reply:
    status: str
    stdout: str = ""
    stderr: str = ""
    error: dict | None = None
    outputs: list = field(default_factory=list)
    seconds: float = 0.0


#: starts of a kernel that dies before its first reply, before giving up
START_TRIES = 3


class Kernel:
    """Start a python3 kernel; ``execute`` returns what that one cell produced. ``argv``,
    ``env`` and ``interrupt_mode`` replace the kernel spec's (another kernel program)."""

    def __init__(self, cwd: str | None = None, argv: list[str] | None = None,
                 env: dict[str, str] | None = None, interrupt_mode: str | None = None) -> None:
        for attempt in range(START_TRIES):
            self.km = KernelManager(kernel_name="python3")
            if argv is not None:
                self.km.kernel_spec.argv = argv
            if interrupt_mode is not None:
                self.km.kernel_spec.interrupt_mode = interrupt_mode
            self.km.start_kernel(cwd=cwd, **({"env": env} if env is not None else {}))
            self.kc = self.km.client()
            self.kc.start_channels()
            try:
                self.kc.wait_for_ready(timeout=60)
                return
            except RuntimeError:
                died = not self.km.is_alive()
                self.kc.stop_channels()
                self.km.shutdown_kernel(now=True)
                if not died or attempt == START_TRIES - 1:
                    raise
                # jupyter_client picks free ports and the kernel binds them later: another
                # process can take one in between (zmq: "Address already in use", the kernel
                # dies at start). A new manager picks new ports.

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def send(self, code: str) -> str:
        return self.kc.execute(code)

    def messages(self, msg_id: str, timeout: float = 120,
                 on_message: Callable[[dict], None] | None = None) -> tuple[str, list[dict]]:
        """(reply status, every iopub message whose parent is ``msg_id``, in order, up to the
        kernel going idle); ``on_message`` sees each message as it arrives."""
        deadline = time.monotonic() + timeout
        msgs = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"kernel did not finish cell {msg_id} in {timeout}s")
            try:
                msg = self.kc.get_iopub_msg(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            msgs.append(msg)
            if on_message is not None:
                on_message(msg)
        while True:
            reply = self.kc.get_shell_msg(timeout=max(deadline - time.monotonic(), 1))
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply["content"]["status"], msgs

    def cell(self, code: str, on_message: Callable[[dict], None] | None = None,
             timeout: float = 120) -> tuple[str, list[dict]]:
        """Run ``code``: (reply status, every iopub message of the cell, in order)."""
        return self.messages(self.send(code), timeout, on_message)

    def collect(self, msg_id: str, timeout: float = 120) -> Reply:
        """What the cell ``msg_id`` printed, raised and displayed, once the kernel is idle."""
        t0 = time.monotonic()
        status, msgs = self.messages(msg_id, timeout)
        rep = Reply(status=status)
        for msg in msgs:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    rep.stdout += content["text"]
                else:
                    rep.stderr += content["text"]
            elif kind == "error":
                rep.error = content
            elif kind in ("execute_result", "display_data"):
                rep.outputs.append(content)
        rep.seconds = time.monotonic() - t0
        return rep

    def execute(self, code: str, timeout: float = 120) -> Reply:
        return self.collect(self.send(code), timeout)

    def value(self, expr: str, timeout: float = 60):
        rep = self.execute(f"print(repr({expr}))", timeout)
        assert rep.status == "ok", rep
        import ast

        return ast.literal_eval(rep.stdout.strip().splitlines()[-1])

    def run_answering(self, code: str, answers: list[str], timeout: float = 60,
                      on_prompt: Callable[[int], bool] | None = None
                      ) -> tuple[str, list[str], str]:
        """Run ``code`` with stdin on, answering each ``input_request`` (pdb's prompt in
        the notebook's input box) with the next of ``answers`` ("c" once they run out);
        ``on_prompt(n)`` returning True acts instead of answering the n-th prompt.
        Returns (stdout and error text, prompts seen, reply status)."""
        msg_id = self.kc.execute(code, allow_stdin=True)
        lines = list(answers)
        prompts: list[str] = []
        out = ""
        idle = False
        deadline = time.monotonic() + timeout
        while not idle:
            if time.monotonic() > deadline:
                raise TimeoutError(f"cell still running after {timeout}s; prompts {prompts}; "
                                   f"output so far:\n{out}")
            try:
                req = self.kc.get_stdin_msg(timeout=0.05)
            except queue.Empty:
                req = None
            if req is not None and req["msg_type"] == "input_request":
                prompts.append(req["content"]["prompt"])
                if on_prompt is not None and on_prompt(len(prompts)):
                    continue  # the callback acted instead of answering (e.g. interrupted)
                self.kc.input(lines.pop(0) if lines else "c")
            while True:
                try:
                    msg = self.kc.get_iopub_msg(timeout=0.01)
                except queue.Empty:
                    break
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "stream":
                    out += msg["content"]["text"]
                elif msg["msg_type"] == "error":
                    out += "\n".join(msg["content"]["traceback"])
                elif msg["msg_type"] == "status" and \
                        msg["content"]["execution_state"] == "idle":
                    idle = True
        reply = self.kc.get_shell_msg(timeout=10)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.kc.get_shell_msg(timeout=10)
        return out, prompts, reply["content"]["status"]

    def close(self) -> None:
        """Stop the channels and the kernel; free the manager's ports, files and zmq context
        even when the kernel is already gone (killed, shut down by the test)."""
        try:
            self.kc.stop_channels()
        finally:
            if self.km.is_alive():
                self.km.shutdown_kernel(now=True)
            else:
                self.km.cleanup_resources()


def kernel_with_world(start: str, timeout: float = 180):
    """Generator for a module-scoped fixture: a kernel that ran ``start`` (loads nbdist and
    starts a world); the world is stopped and the kernel closed afterwards, whatever happens."""
    k = Kernel()
    try:
        rep = k.execute(start, timeout=timeout)
        assert rep.status == "ok", rep
        yield k
        k.execute("%dist_stop", timeout=60)
    finally:
        k.close()


def kill_tree(pid: int) -> None:
    """Kill ``pid`` and every process below it."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
