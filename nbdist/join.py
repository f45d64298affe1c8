"""``python -m nbdist.join``: the agent a launcher starts on another host (see
``nbdist.proc.agent``); it reads its instructions from stdin."""

from .proc.agent import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
