"""Run a function right after a module is first imported, without importing it ourselves.

``after_import(name, then)`` calls ``then(module)`` at once if ``name`` is imported already,
else as soon as its code has run (a finder on ``sys.meta_path`` wraps that module's loader and
steps aside once it has fired). So ``%load_ext`` can patch torch without importing torch, and
names other modules bind from the patched one (``from m import f``) are the patched ones.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["after_import"]

_LOCK_PER_PROCESS = threading.Lock()


def after_import(name: str, then: Callable[[Any], None]) -> None:
    """``then(module)`` once ``name`` is imported (now, if it is)."""
    with _LOCK_PER_PROCESS:
        module = sys.modules.get(name)
        if module is None:
            sys.meta_path.insert(0, _AfterImport(name, then))
    if module is not None:
        then(module)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds one module as the path finder does, and calls ``then`` once its code ran."""

    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            with _LOCK_PER_PROCESS:
                if self in sys.meta_path:
                    sys.meta_path.remove(self)
            self.then(module)

        spec.loader.exec_module = exec_module  # this spec's own loader object
        return spec
