"""What a world adds around torch's process groups: where user groups meet, torchrun's
environment, destroyed groups freed safely (docs/layout.md)."""

__all__: list[str] = []
