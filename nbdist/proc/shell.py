"""IPython on a worker: one shell per process runs ``%%dist`` cells; rich output leaves as messages.

The shell is an ``InteractiveShell`` (magics, ``!``, ``?``, input transformations, the display
hook; no ZeroMQ, no history database), made once by the warm template before it forks
(``preload``), so every worker has it from its first instruction, RPC functions included.

What it displays (``display()``, inline matplotlib figures, a cell's rich last value) goes to the
notebook as ``DisplayData``, binary values base64-encoded as in Jupyter's wire format; a bundle
over ``LIMIT`` bytes becomes a note naming rank and size, one over ``CHUNK`` bytes travels as
``DisplayChunk`` pieces; a widget shows live when its comm is relayed (``comms``), else as its
text repr and a note. ``clear_output`` is sent as ``ClearOutput``.
"""

from __future__ import annotations
import __future__

import ast
import base64
import builtins
import itertools
import linecache
import os
import sys
import traceback
import types
from collections.abc import Callable
from typing import Any

from ..control.protocol import ClearOutput, DisplayChunk, DisplayData, Message, Result, encode
from ..errors import safe_str
from ..table import human_bytes
from ..tracebacks import own_file

__all__ = ["LIMIT", "MPL_INLINE", "bind", "main_module", "preload", "run_cell"]

LIMIT = 10 * 2**20  # bytes of one display; NBDIST_DISPLAY_MB in the notebook sets it
CHUNK = 256 * 2**10  # a display bigger than this travels in pieces of this size
MPL_INLINE = "module://matplotlib_inline.backend_inline"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
_NOTHING = object()


class _ShellOfThisProcess:
    """The worker's shell, made once per process (in the template, before the fork), and
    where its displays go and whose they are (``bind``, once the worker has its channel)."""

    def __init__(self) -> None:
        self.shell: Any = None
        self.send: Callable[[Message], None] | None = None
        self.rank = -1
        self.name = ""
        self.limit = LIMIT  # bytes of one display: NBDIST_DISPLAY_MB, read at ``bind``
        self.printers: list[dict] | None = None  # the formatters' type tables, once looked up


_SHELL_PER_PROCESS = _ShellOfThisProcess()
_BUNDLES_PER_PROCESS = itertools.count(1)  # numbers the displays sent in pieces


def _make_shell() -> Any:
    """Create the process's shell on a fresh ``__main__``-to-be module (not installed yet)."""
    from IPython.core.compilerop import CachingCompiler
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets import Type
    from traitlets.config import Config

    class Compiler(CachingCompiler):
        """Names every cell after the notebook's cell (``<dist-cell-N>``) in tracebacks."""

        filename = ""

        def get_code_name(self, raw_code: str, transformed_code: str, number: int) -> str:
            return self.filename or super().get_code_name(raw_code, transformed_code, number)

    class Publisher(DisplayPublisher):
        """``display()``, figures and ``clear_output``: each becomes a message."""

        def publish(self, data: dict, metadata: dict | None = None, source: Any = None, *,
                    transient: dict | None = None, update: bool = False, **kw: Any) -> None:
            display_id = (transient or {}).get("display_id")
            _publish(data, metadata, display_id, update, 0)

        def clear_output(self, wait: bool = False) -> None:
            _flush_streams()
            _deliver(ClearOutput(_SHELL_PER_PROCESS.rank, bool(wait)))

    class Hook(DisplayHook):
        """The last expression: kept for the ``Result``; a rich repr is also displayed."""

        def __call__(self, result: Any = None) -> None:
            self.check_for_underscore()
            if result is None or _quiet(self.shell):
                return
            _remember(self, result)
            self.fill_exec_result(result)
            shell = self.shell
            shell.nbdist_value = result
            rich, md = _rich_formats(shell, result)
            if rich:
                rich["text/plain"] = _safe_repr(result)
                _publish(rich, md, None, False, shell.nbdist_exec_id)

    class WorkerShell(InteractiveShell):
        """A kernel-less shell: tracebacks are reported by ``run_cell``, not printed."""

        compiler_class = Type(Compiler)
        display_pub_class = Type(Publisher)
        displayhook_class = Type(Hook)
        nbdist_value: Any = _NOTHING
        nbdist_exec_id = 0
        nbdist_raw = ""

        def init_virtualenv(self) -> None:  # the notebook's sys.path is used as it is
            return None

        def showtraceback(self, *args: Any, **kwargs: Any) -> None:
            return None

        def showsyntaxerror(self, *args: Any, **kwargs: Any) -> None:
            return None

        def showindentationerror(self) -> None:
            return None

        def ask_exit(self) -> None:
            """``exit()`` in a cell: a worker is ended by ``%dist_stop``, so this is an
            error the cell reports (``SystemExit``), as before workers spoke IPython."""
            raise SystemExit(0)

        def system(self, cmd: str) -> None:
            """``!cmd``: the user's shell, its output read here and written to this
            process's streams as it comes (so it shows in order, before the cell's result);
            its exit code goes to ``_exit_code`` as in IPython."""
            cmd = self.var_expand(cmd, depth=1)
            _flush_streams()
            try:
                code = _run_piped(cmd)
            except KeyboardInterrupt:
                print("\n" + self.get_exception_only(), file=sys.stderr)
                code = 130
            self.user_ns["_exit_code"] = -(code - 128) if code > 128 else code
            if self.system_raise_on_error and code:
                import subprocess

                raise subprocess.CalledProcessError(code, cmd)

    cfg = Config()
    cfg.HistoryManager.enabled = False
    cfg.HistoryManager.hist_file = ":memory:"
    cfg.InteractiveShell.colors = "nocolor"
    cfg.InteractiveShell.autocall = 0
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    before = sys.modules.get("__main__")
    shell = WorkerShell.instance(config=cfg, user_module=main)
    if before is not None:  # the shell installs its module; the process keeps its own for now
        sys.modules["__main__"] = before
    shell.set_hook("show_in_pager", _page)
    return shell


def preload() -> None:
    """Make the shell now (in the template: every forked worker inherits it)."""
    here = _SHELL_PER_PROCESS
    if here.shell is None:
        here.shell = _make_shell()


def main_module() -> types.ModuleType:
    """The module the worker's cells run in (the shell's ``user_module``)."""
    preload()
    return _SHELL_PER_PROCESS.shell.user_module


def bind(send: Callable[[Message], None], rank: int, name: str) -> None:
    """In the worker: where displays go and whose they are; matplotlib draws inline."""
    preload()
    here = _SHELL_PER_PROCESS
    here.send, here.rank, here.name = send, rank, name
    here.limit = int(float(os.environ.get("NBDIST_DISPLAY_MB", LIMIT / 2**20)) * 2**20)
    here.shell.user_ns["_dh"] = [os.getcwd()]
    # figures become PNG displays: plt.show() and figures left open at the end of a cell
    os.environ["MPLBACKEND"] = os.environ.get("NBDIST_WORKER_MPLBACKEND", MPL_INLINE)


def run_cell(code: str, filename: str, exec_id: int,
             cancelled: Callable[[], bool] = lambda: False) -> Result:
    """Run one cell through the shell; the ``Result`` carries the last value's repr or the
    error with the traceback from the cell's own frame on. ``cancelled()`` is asked once the
    events before the cell ran: IPython's event hooks swallow a Ctrl-C that lands in them.

    Plain Python (it parses, and no custom transformer is installed) takes a short way with
    the same meaning (events, display hook, ``_``); anything else, magics, ``!``, ``?`` and
    top-level ``await`` included, goes through IPython's ``run_cell``. IPython's input
    transformations leave code that parses unchanged, so both ways run the same program.
    """
    shell = _SHELL_PER_PROCESS.shell
    shell.nbdist_exec_id, shell.nbdist_raw, shell.nbdist_value = exec_id, code, _NOTHING
    tree = _parse_plain(shell, code, filename)
    err: BaseException | None
    if tree is not None:
        err = _run_plain(shell, tree, code, filename, cancelled)
    else:
        shell.compile.filename = filename
        try:
            outcome = shell.run_cell(code, store_history=False)
            err = outcome.error_before_exec or outcome.error_in_exec
        except BaseException as exc:  # noqa: BLE001 - Ctrl-C between IPython's steps
            err = exc
        finally:
            shell.compile.filename = ""
    value, shell.nbdist_value = shell.nbdist_value, _NOTHING
    if err is not None:
        tb = _from_cell(err, filename)
        sys.last_type, sys.last_value, sys.last_traceback = type(err), err, tb  # %dist_debug
        return Result(_SHELL_PER_PROCESS.rank, exec_id, "error", None, type(err).__name__,
                      safe_str(err), "".join(traceback.format_exception(type(err), err, tb)))
    if value is _NOTHING:
        return Result(_SHELL_PER_PROCESS.rank, exec_id, "ok")
    return Result(_SHELL_PER_PROCESS.rank, exec_id, "ok", _safe_repr(value))


def _parse_plain(shell: Any, code: str, filename: str) -> ast.Module | None:
    """The cell's tree if the short way can run it: no custom transformers, and no
    ``await``/``async`` (``ast.parse`` accepts a top-level ``await``; IPython runs it)."""
    if shell.ast_transformers or shell.input_transformers_post or "async" in code or \
            "await" in code:
        return None
    try:
        return ast.parse(code, filename, "exec")
    except (SyntaxError, ValueError):
        return None


def _run_plain(shell: Any, tree: ast.Module, code: str, filename: str,
               cancelled: Callable[[], bool]) -> BaseException | None:
    """The statements, then the last expression through the display hook, between the
    events IPython triggers around a cell (the inline backend shows figures at the end)."""
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    events = shell.events
    run_hooks = bool(events.callbacks["pre_run_cell"] or events.callbacks["post_run_cell"])
    outcome = None
    if run_hooks:
        from IPython.core.interactiveshell import ExecutionInfo, ExecutionResult

        info = ExecutionInfo(code, False, False, True, None)
        outcome = ExecutionResult(info)
        events.trigger("pre_run_cell", info)
    events.trigger("pre_execute")
    err = None
    try:
        if cancelled():  # Ctrl-C came during the events (IPython's trigger swallows it)
            raise KeyboardInterrupt
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        ns = shell.user_ns
        # the cell's own __future__ flags as IPython keeps them, never this module's
        flags = shell.compile.flags & _FUTURE_FLAGS
        exec(compile(tree, filename, "exec", flags, dont_inherit=True), ns)
        if last is not None:
            shell.displayhook(eval(compile(last, filename, "eval", flags, dont_inherit=True), ns))
    except BaseException as exc:  # noqa: BLE001 - reported as the cell's error
        err = exc
    finally:
        events.trigger("post_execute")
        if outcome is not None:
            outcome.error_in_exec = err
            events.trigger("post_run_cell", outcome)
    return err


_FUTURE_FLAGS = sum(getattr(__future__, name).compiler_flag
                   for name in __future__.all_feature_names)
_PLAIN_TYPES = frozenset({int, float, bool, str, bytes, complex, list, tuple, dict, set,
                          frozenset, range, type(None)})


def _remember(hook: Any, value: Any) -> None:
    """``_``, ``__``, ``___`` as IPython keeps them (a user's own ``_`` is left alone);
    without ``_N``/``Out``: workers have no execution count."""
    shell = hook.shell
    ns, hidden = shell.user_ns, shell.user_ns_hidden
    mine = all(name not in ns or hidden.get(name, _NOTHING) is ns[name]
               or getattr(hook, name) is ns[name] for name in ("_", "__", "___"))
    hook.___, hook.__, hook._ = hook.__, hook._, value
    if mine and "_" not in builtins.__dict__:
        new = {"_": hook._, "__": hook.__, "___": hook.___}
        ns.update(new)
        hidden.update(new)


def _rich_formats(shell: Any, value: Any) -> tuple[dict, dict]:
    """The value's formats beyond text; builtin types have none unless a formatter was
    registered for them (asking every formatter costs ~80 us, most of a trivial cell)."""
    formatter = shell.display_formatter
    kind = type(value)
    if kind in _PLAIN_TYPES:
        here = _SHELL_PER_PROCESS
        if here.printers is None:  # the dicts ``for_type`` fills (kept: traitlets are slow)
            here.printers = [f.type_printers for f in formatter.formatters.values()
                             if f.format_type != "text/plain"]
        if not any(kind in printers for printers in here.printers):
            return {}, {}
    try:
        return formatter.format(value, exclude=("text/plain",))
    except Exception:  # noqa: BLE001 - a broken _repr_*_ leaves the text repr
        return {}, {}


def _run_piped(cmd: str) -> int:
    """Run ``cmd`` in the user's shell, copying its stdout and stderr to ours as they come;
    Ctrl-C interrupts it (then kills it after 2 s) and is raised again."""
    import codecs
    import selectors
    import signal
    import subprocess

    proc = subprocess.Popen(cmd, shell=True, executable=os.environ.get("SHELL") or None,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    sel = selectors.DefaultSelector()
    try:
        for pipe, stream in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
            sel.register(pipe, selectors.EVENT_READ,
                         (stream, codecs.getincrementaldecoder("utf-8")("replace")))
        while sel.get_map():
            for key, _ in sel.select():
                data = os.read(key.fd, 65536)
                stream, decoder = key.data
                if not data:
                    sel.unregister(key.fileobj)
                    data = b""
                text = decoder.decode(data, final=not data)
                if text:
                    stream.write(text)
        return proc.wait()
    except BaseException:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(2.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(2.0)
        raise
    finally:
        sel.close()
        proc.stdout.close()
        proc.stderr.close()


def _from_cell(exc: BaseException, filename: str) -> Any:
    """The traceback from the cell's first frame on (IPython's frames above it are not the
    user's business); None for errors before the cell ran (a syntax error). After Ctrl-C it
    ends at the user's line: the signal handler's frames below it are nbdist's."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    if isinstance(exc, KeyboardInterrupt):
        last, t = None, tb
        while t is not None:
            if not own_file(t.tb_frame.f_code.co_filename):
                last = t
            t = t.tb_next
        if last is not None:
            last.tb_next = None
    return tb


def _quiet(shell: Any) -> bool:
    """A trailing ``;`` hides the last value, as in IPython."""
    raw = shell.nbdist_raw.rstrip()
    return raw.endswith(";") and shell.displayhook.semicolon_at_end_of_expression(raw)


def _page(self: Any, data: Any, start: int = 0, screen_lines: int = 0,
          pager_cmd: Any = None) -> None:
    """``obj?`` help text: printed (it shows in the calling cell like any output)."""
    text = data.get("text/plain", "") if isinstance(data, dict) else str(data)
    print(text[start:] if isinstance(start, int) and start > 0 else text)


# ---- displays -----------------------------------------------------------------------------------
def _publish(data: dict, metadata: dict | None, display_id: str | None, update: bool,
             result_of: int) -> None:
    bundle = {str(k): _wire(v) for k, v in data.items()}
    if WIDGET_MIME in bundle and not _relayed_widget(bundle[WIDGET_MIME]):
        del bundle[WIDGET_MIME]
        bundle["text/plain"] = (f"{bundle.get('text/plain', 'a widget')}\n(nbdist: widgets live "
                                "in the notebook, rank 0: make them there and feed them with "
                                "what the workers return)")
    size = sum(len(v) if isinstance(v, str) else len(repr(v)) for v in bundle.values())
    here = _SHELL_PER_PROCESS
    if size > here.limit:
        bundle = {"text/plain": f"nbdist: a display of {human_bytes(size)} from rank "
                                f"{here.rank} ({here.name}) was not shown (limit "
                                f"{here.limit / 2**20:g} MB; NBDIST_DISPLAY_MB sets it)"}
        metadata = {}
    _flush_streams()  # what was printed before the display shows before it
    msg = DisplayData(here.rank, bundle, _plain(metadata or {}), display_id, bool(update),
                      result_of)
    if size > CHUNK:
        _deliver_pieces(msg)
    else:
        _deliver(msg)


def _relayed_widget(view: Any) -> bool:
    """Whether a widget view's model is a comm the notebook relays (``comms``): then the
    view shows there as a live widget."""
    from ..comms import channel_comm as comms

    return isinstance(view, dict) and comms.relayed(str(view.get("model_id")))


def _deliver_pieces(msg: DisplayData) -> None:
    """A big display as ``DisplayChunk`` frames of ``CHUNK`` bytes: the notebook reads the
    other ranks' messages between them, and shows the display when the last one arrives.
    Printed output sent after the display still comes after it (one channel, in order)."""
    send, rank = _SHELL_PER_PROCESS.send, _SHELL_PER_PROCESS.rank
    if send is None:
        return
    payload = encode(msg)
    if len(payload) <= CHUNK:
        _deliver(msg)
        return
    bundle, total = next(_BUNDLES_PER_PROCESS), -(-len(payload) // CHUNK)
    view = memoryview(payload)
    for i in range(total):
        try:
            send(DisplayChunk(rank, bundle, i, total, bytes(view[i * CHUNK:(i + 1) * CHUNK])))
        except OSError:  # blocked or closed: the notebook drops the unfinished display
            return


def _wire(value: Any) -> Any:
    """Jupyter's wire form: binary as base64 text, JSON as plain data."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, str):
        return value
    return _plain(value)


def _plain(value: Any) -> Any:
    """Only what the control channel carries (plain data); anything else as its str."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    try:
        if hasattr(value, "item"):  # numpy/torch scalars
            return _plain(value.item())
    except Exception:  # noqa: BLE001
        pass
    return str(value)


def _deliver(msg: Message) -> None:
    send = _SHELL_PER_PROCESS.send
    if send is None:
        return
    try:
        send(msg)
    except OSError:  # the channel is blocked or closed: a display is not worth a hang
        pass


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


def _safe_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception as exc:  # noqa: BLE001 - a broken __repr__ must not kill the worker
        return f"<{type(value).__name__} object; repr() failed: {exc!r}>"
