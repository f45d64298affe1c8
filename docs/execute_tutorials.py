"""Run the tutorial notebooks for the docs site, so their pages show outputs and plots.

``python docs/execute_tutorials.py [--only REGEX]`` (``make docs`` runs it) executes each
``notebooks/NN_*.ipynb`` headless in a real kernel, in quick mode (``NBDIST_QUICK=1``, as the
tests run them) and in a temporary working directory, and writes the executed copy to
``docs/_build/executed/``. A copy is made again only when its notebook changed (the copy
records the digest of the notebook it came from). A notebook that fails is reported and left
out: its page then shows the notebook as committed, without outputs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / "docs" / "_build" / "executed"
DIGEST_KEY = "nbdist_source_sha256"  # in the executed copy's metadata
CELL_TIMEOUT_S = 600

__all__ = ["EXECUTED", "digest", "is_current", "execute", "main"]


def digest(path: Path) -> str:
    """The digest of a committed notebook's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def is_current(source: Path, executed: Path) -> bool:
    """Whether ``executed`` was made from ``source`` as it is now."""
    import nbformat

    if not executed.is_file():
        return False
    nb = nbformat.read(str(executed), as_version=4)
    return nb.metadata.get(DIGEST_KEY) == digest(source)


def execute(source: Path, into: Path = EXECUTED) -> Path:
    """Execute ``source`` in quick mode and write the executed copy into ``into``."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(str(source), as_version=4)
    env = dict(os.environ, NBDIST_QUICK="1")
    with tempfile.TemporaryDirectory(prefix="nbdist-docs-") as cwd:
        client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                resources={"metadata": {"path": cwd}})
        saved = dict(os.environ)
        os.environ.update(env)  # the kernel inherits this process's environment
        try:
            client.execute()
        finally:
            os.environ.clear()
            os.environ.update(saved)
    nb.metadata[DIGEST_KEY] = digest(source)
    into.mkdir(parents=True, exist_ok=True)
    out = into / source.name
    nbformat.write(nb, str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", metavar="REGEX", help="the notebooks whose name matches REGEX")
    ap.add_argument("--into", default=str(EXECUTED), help="where executed copies go")
    args = ap.parse_args(argv)
    into = Path(args.into)
    failed = []
    for source in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        if args.only and not re.search(args.only, source.name):
            continue
        if is_current(source, into / source.name):
            continue
        t0 = time.monotonic()
        print(f"running {source.name} for the docs ...", flush=True)
        try:
            execute(source, into)
        except Exception as exc:  # noqa: BLE001 - one failed tutorial must not stop the rest
            first = str(exc).strip().splitlines()[-1:] or [type(exc).__name__]
            print(f"  {source.name} failed ({first[0][:200]}); its page shows no outputs",
                  flush=True)
            failed.append(source.name)
            continue
        print(f"  done in {time.monotonic() - t0:.0f}s", flush=True)
    if failed:
        print(f"{len(failed)} tutorial(s) not executed: {', '.join(failed)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
