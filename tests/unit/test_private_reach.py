"""nbdist's reach into torch and cloudpickle, found by AST: every private name it reads is in
the registry (``patches/torch_private.py``)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

import nbdist

PACKAGE = Path(nbdist.__file__).parent
LIBRARIES = ("torch", "cloudpickle")
PATCHES = PACKAGE / "patches"


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _library(dotted: str) -> bool:
    return dotted.split(".", 1)[0] in LIBRARIES


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Names a module binds to a torch or cloudpickle module or object, by import (at any
    depth: function-level imports too): local name -> dotted path."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _library(a.name):
                    found[a.asname or a.name.split(".")[0]] = a.name if a.asname else \
                        a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and _library(node.module):
            for a in node.names:
                found[a.asname or a.name] = f"{node.module}.{a.name}"
    return found


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """``a.b.c`` as the dotted path it names, where ``a`` is bound to a library by import."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id], *reversed(parts)])


def _up_to_private(path: str) -> str | None:
    """``path`` cut after its last private part (what nbdist relies on), or None."""
    parts = path.split(".")
    last = max((i for i, part in enumerate(parts) if _is_private(part)), default=None)
    return None if last is None else ".".join(parts[:last + 1])


def reaches(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """Each private name of torch or cloudpickle the code relies on, and its line: read as
    ``a.b._c`` (the whole chain, cut after its last private part), as ``getattr(a, "_c")``,
    or imported (``from torch.x import _c``)."""
    aliases = _aliases(tree)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        path = None
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            path = _dotted(node, aliases)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            base = _dotted(node.args[0], aliases) if isinstance(node.args[0], ast.Attribute) \
                else aliases.get(getattr(node.args[0], "id", ""))
            path = f"{base}.{node.args[1].value}" if base else None
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and _library(node.module):
            for a in node.names:
                cut = _up_to_private(f"{node.module}.{a.name}")
                if cut:
                    yield cut, node.lineno
            continue
        cut = _up_to_private(path) if path else None
        if cut:
            yield cut, node.lineno


def _registered(path: str, names: set[str]) -> bool:
    """A registered name, or an object on the way to one (``internal._internal_rpc_pickler``,
    the module ``torch._C._distributed_rpc``)."""
    return any(n == path or n.startswith(path + ".") for n in names)


def unregistered() -> dict[str, str]:
    """Every private reach of the package that is not in the registry: path -> where."""
    from nbdist.patches import torch_private

    names = {p.name for p in torch_private.PRIVATES}
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for dotted, line in reaches(ast.parse(path.read_text())):
            if not _registered(dotted, names):
                found.setdefault(dotted, f"{path.relative_to(PACKAGE.parent)}:{line}")
    return found


def test_every_private_reach_into_torch_or_cloudpickle_is_registered():
    missing = unregistered()
    assert not missing, "private names of torch or cloudpickle reached but not in " \
                        f"torch_private.PRIVATES: {missing}"


def test_only_patches_reads_private_names():
    """Issue 53: every private name of torch or cloudpickle is read in ``nbdist/patches/``
    (one room to read on the day a new torch comes out); the rest calls what it offers."""
    outside = outside_patches(reaches)
    assert not outside, f"private names read outside patches/: {outside}"


def outside_patches(scan: Callable[[ast.AST], Iterator[tuple[str, int]]]) -> dict[str, str]:
    """What ``scan`` finds in the package's modules outside patches/: ``file:line`` -> name."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if PATCHES not in path.parents:
            for dotted, line in scan(ast.parse(path.read_text())):
                found[f"{path.relative_to(PACKAGE).as_posix()}:{line}"] = dotted
    return found


def test_the_scan_finds_a_reach_of_each_kind():
    """The scanner itself: a private read, getattr and import are found, public ones not."""
    source = (
        "import cloudpickle\nimport torch.distributed.rpc as rpc\n"
        "from torch.distributed.rpc import api\nfrom torch._C import _secret\n"
        "def f():\n    from cloudpickle import cloudpickle as cp\n"
        "    return cp._hidden.x, rpc.api._invoke_rpc, getattr(api, '_other'), api.rpc_sync, "
        "cloudpickle.dumps, cloudpickle.__version__\n")
    found = {path for path, _ in reaches(ast.parse(source))}
    assert found == {"cloudpickle.cloudpickle._hidden", "torch.distributed.rpc.api._invoke_rpc",
                     "torch.distributed.rpc.api._other", "torch._C._secret"}
    from nbdist.patches import torch_private

    names = {p.name for p in torch_private.PRIVATES}
    assert not _registered("cloudpickle.cloudpickle._hidden", names)
    assert _registered("torch.distributed.rpc.api._invoke_rpc", names)
    assert _registered("torch.distributed.rpc.internal._internal_rpc_pickler", names)


# -- replacing torch's and cloudpickle's attributes: only patches/ does it -----------------


def assignments(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """Each torch or cloudpickle attribute the code assigns or deletes (``a.b = x``,
    ``del a.b``, ``setattr(a, "b", x)``), and its line."""
    aliases = _aliases(tree)
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):  # a.b, c = ...
                targets.extend(t.elts)
            elif isinstance(t, ast.Starred):
                targets.append(t.value)
            elif isinstance(t, ast.Attribute) and (path := _dotted(t, aliases)):
                yield path, node.lineno
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("setattr", "delattr") and node.args:
            base = node.args[0]
            path = _dotted(base, aliases) if isinstance(base, ast.Attribute) else \
                aliases.get(getattr(base, "id", ""))
            if path:
                yield path, node.lineno


def _replacing(tree: ast.AST) -> bool:
    """Whether the module calls ``patches.replaced.replace``."""
    return any(isinstance(n, ast.ImportFrom) and n.module and n.module.endswith(
        "patches.replaced") for n in ast.walk(tree))


def test_nothing_outside_patches_assigns_to_torch_or_cloudpickle():
    found = outside_patches(assignments)
    assert not found, f"attributes of torch or cloudpickle replaced outside patches/: {found}"


def test_no_module_outside_patches_replaces_attributes():
    """Not even through ``patches.replaced``: the features outside patches/ hand their
    wrappers to a patch module (``patches.rpc_calls`` for the pickler and tracing)."""
    replacing = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
                 if PATCHES not in path.parents and _replacing(ast.parse(path.read_text()))}
    assert not replacing, f"modules replacing torch's attributes outside patches/: {replacing}"


def test_the_assignment_scan_sees_each_kind():
    source = ("import torch.distributed.rpc as rpc\nfrom torch.distributed.rpc import api\n"
              "import cloudpickle\n"
              "def f():\n    api.rpc_sync = 1\n    rpc.api._x, y = 2, 3\n"
              "    setattr(cloudpickle.cloudpickle, 'z', 4)\n    del api.remote\n"
              "    table = {}\n    table[api.rpc_sync] = 5\n")
    assert sorted(p for p, _ in assignments(ast.parse(source))) == [
        "cloudpickle.cloudpickle", "torch.distributed.rpc.api._x",
        "torch.distributed.rpc.api.remote", "torch.distributed.rpc.api.rpc_sync"]
