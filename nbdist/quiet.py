"""Keep torch's C++ log noise out of the notebook while nbdist itself causes it.

When rank 0 shuts its RPC agent down, TensorPipe logs one ``pipe closed`` warning per peer
straight to file descriptor 2, which Jupyter shows in the cell. ``drop_fd2_lines`` filters
those lines (and only those) for the duration of a block.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["SHUTDOWN_NOISE", "drop_fd2_lines"]

SHUTDOWN_NOISE = re.compile(rb"tensorpipe_agent\.cpp.*encountered error|pipe closed|"
                            rb"ProcessGroupGloo|Connection reset by peer|EOF")


@contextmanager
def drop_fd2_lines(pattern: re.Pattern = SHUTDOWN_NOISE) -> Iterator[None]:
    """Within the block, lines written to fd 2 that match ``pattern`` are dropped."""
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    saved = os.dup(2)
    r, w = os.pipe()
    os.dup2(w, 2)
    os.close(w)

    def pump() -> None:
        pending = b""
        while True:
            data = os.read(r, 65536)
            if not data:
                break
            pending += data
            *lines, pending = pending.split(b"\n")
            keep = [ln + b"\n" for ln in lines if not pattern.search(ln)]
            if keep:
                os.write(saved, b"".join(keep))
        if pending and not pattern.search(pending):
            os.write(saved, pending)

    t = threading.Thread(target=pump, daemon=True, name="nbdist-fd2-filter")
    t.start()
    try:
        yield
    finally:
        os.dup2(saved, 2)  # closes the pipe's only write end, so the pump sees EOF
        t.join(2.0)
        os.close(r)
        os.close(saved)
