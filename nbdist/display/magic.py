"""``%dist_dashboard``: a thin magic over ``nbdist.display.dashboard``.

Registered by ``%load_ext nbdist`` (``load_ipython_extension`` calls ``register``).
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

__all__ = ["DashboardMagics", "register"]


@magics_class
class DashboardMagics(Magics):
    """``%dist_dashboard``: live plots of logged values, RPC latencies and ranks."""

    @magic_arguments()
    @argument("--keys", default=None, help="logged values to plot, comma-separated "
              "(default: the first four logged)")
    @argument("--window", type=int, default=20, help="steps in the running mean (default 20)")
    @argument("--hz", type=float, default=5.0, help="most redraws per second (default 5)")
    @argument("--save-to", default=None, help="also keep this PNG file up to date")
    @line_magic
    def dist_dashboard(self, line: str) -> Any:
        """Show a live dashboard; returns it (``.save(path)``, ``.close()``)."""
        try:
            args = parse_argstring(self.dist_dashboard, line)
        except UsageError as exc:
            raise UsageError(f"%dist_dashboard: {exc}; see `%dist_dashboard?`") from None
        if args.window < 1:
            raise UsageError("%dist_dashboard: --window must be at least 1")
        if args.hz <= 0:
            raise UsageError("%dist_dashboard: --hz must be a positive number")
        from . import dashboard

        dashboard(keys=args.keys, window=args.window, hz=args.hz, save_to=args.save_to)
        return None


def register(ipython: Any) -> None:
    """Add ``%dist_dashboard`` to ``ipython``."""
    ipython.register_magics(DashboardMagics)
