"""The package's layers: imports run downward only (design.md), checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "nbdist"

# lower number = lower layer; a module may import its own layer or lower ones
LAYERS = {
    "devices": 0, "envflag": 0, "errors": 0, "spec": 0, "table": 0,
    "patches": 1, "telemetry": 1,
    "proc": 2,
    "cluster": 3,
    "magics": 4, "join": 4, "display": 4, "parallel": 4, "tutorials": 4, "__init__": 4,
}


def _layer(dotted: str) -> tuple[str, int]:
    top = dotted.split(".")[0]
    return top, LAYERS[top]


def _imports(source: str, module: str) -> list[tuple[int, str]]:
    """(line, module under nbdist) for every nbdist import in ``source``, nested ones too;
    ``module`` is where the source lives, dotted under nbdist (``proc.channel``)."""
    package = module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                target = base + (node.module.split(".") if node.module else [])
                names = [target + [a.name] for a in node.names] if not node.module else [target]
            elif node.module and node.module.startswith("nbdist."):
                names = [node.module.split(".")[1:]]
            else:
                continue
            found += [(node.lineno, ".".join(n)) for n in names if n]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".", 1)[1]) for a in node.names
                      if a.name.startswith("nbdist.")]
    return sorted(found)


def test_every_module_has_a_layer():
    tops = {p.relative_to(PKG).parts[0].removesuffix(".py") for p in PKG.rglob("*.py")}
    assert tops <= set(LAYERS), f"give these a layer in tests/test_layers.py: {tops - set(LAYERS)}"


def test_imports_point_down_only():
    upward = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).with_suffix("")
        me, mine = _layer(".".join(rel.parts))
        for line, target in _imports(path.read_text(), ".".join(rel.parts)):
            them, theirs = _layer(target)
            if theirs > mine:
                upward.append(f"{path.relative_to(PKG.parent)}:{line} ({me}, layer {mine}) "
                              f"imports {target} ({them}, layer {theirs})")
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def test_the_checker_sees_upward_imports():
    """The checker itself: relative, nested and absolute imports are all found."""
    source = ("from ..cluster import core\n"
              "def f():\n    from ..display.live import Dashboard\n"
              "import nbdist.magics\n")
    found = [t for _, t in _imports(source, "proc.channel")]
    assert found == ["cluster", "display.live", "magics"]
    assert all(_layer(t)[1] > _layer("proc.channel")[1] for t in found)
