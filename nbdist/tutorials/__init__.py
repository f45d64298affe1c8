"""Importable code behind the tutorial notebooks, for cells that would be too long and for
benchmarks that run as scripts (where a notebook's ``__main__`` classes do not exist)."""

__all__: list[str] = []
