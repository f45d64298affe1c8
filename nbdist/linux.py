"""nbdist runs on Linux only: checked when this module is imported, which ``import nbdist``
(and so ``%load_ext nbdist``) does before anything else, so that another platform learns it
in one line instead of a traceback from deep inside a start."""

from __future__ import annotations

import sys

__all__ = ["NotLinuxError", "message", "require_linux"]


def message(platform: str) -> str:
    """The one line a user on ``platform`` reads."""
    return (f"nbdist runs on Linux only, not on {platform}: its workers fork from a warm "
            "template process, talk to the notebook over unix sockets and are watched "
            "through /proc (on Windows, run Jupyter inside WSL2)")


class NotLinuxError(ImportError):
    """``import nbdist`` on a platform other than Linux."""

    def _render_traceback_(self) -> list[str]:
        """IPython shows this instead of a traceback: the one line."""
        return [str(self)]


def require_linux(platform: str | None = None) -> None:
    """Raise ``NotLinuxError`` unless ``platform`` (default: this one) is Linux."""
    platform = sys.platform if platform is None else platform
    if not platform.startswith("linux"):
        raise NotLinuxError(message(platform))


require_linux()
