"""``mp.spawn`` from a cell: the patch that asks the world first, the world's side, and one
rank's part (docs/layout.md)."""

__all__: list[str] = []
