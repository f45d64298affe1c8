"""One-line hints added to a rank's error where nbdist knows more than the traceback says.

``where_defined``: a worker's ``NameError`` for a name the notebook (rank 0) has in its own
``__main__`` says where the name lives and which cell magic defines it on every rank.
"""

from __future__ import annotations

import re

from ..shipping import own_main

__all__ = ["where_defined"]

_UNDEFINED = re.compile(r"name '([A-Za-z_][A-Za-z_0-9]*)' is not defined")


def where_defined(error_type: str | None, message: str | None) -> str:
    """The hint line (ending in a newline) for this error, or ``""``."""
    if error_type != "NameError" or not message:
        return ""
    found = _UNDEFINED.search(message)
    if found is None or found.group(1) not in own_main.main_namespace():
        return ""
    name = found.group(1)
    return (f"nbdist: {name!r} is defined in the notebook (rank 0) only; `%%dist --local` "
            f"(or `%%dist`) in the cell that defines it defines it on every rank\n")
