"""What a world adds around torch's process groups: where user groups meet, torchrun's
environment, destroyed groups freed safely (README, Layout)."""

__all__: list[str] = []
