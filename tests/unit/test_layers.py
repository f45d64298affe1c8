"""The package's shape, checked on the source: imports run downward only (docs/layout.md),
no module reaches itself through a circle of imports (inside a package or across), and no
nbdist module is imported by a name computed at run time."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

PKG = ROOT / "nbdist"

# lower number = lower layer; a module may import its own layer or lower ones. A room holding
# both sides of a feature gives the ranks' side its own, lower layer (the longest name wins).
# No room shares a layer with one it must not import: the facade (``cluster``) stands above
# the notebook's sides of the feature rooms it drives, and the control channel below every
# process that speaks it; the data they share (``RankInfo``, ``RankConfig``) is plain data.
LAYERS = {
    "devices": 0, "envflag": 0, "errors": 0, "linux": 0, "spec": 0, "table": 0,
    "rank_sets": 0, "tracebacks": 0, "world_state": 0, "rank_config": 0, "rank_info": 0,
    "thread_raise": 0, "open_files": 0, "wake_flag": 0, "fd_wait": 0,
    "patches": 1, "shipping": 1, "shm": 1, "groups": 1, "telemetry": 1,
    "control": 2,
    "proc": 3, "hosts": 3,
    "output.rank_streams": 3, "comms.channel_comm": 3, "debugging.remote_pdb": 3,
    "output": 4, "comms": 4, "debugging": 4, "hosts.allocation": 4,
    "cluster": 5, "spawn": 5,
    "magics": 6, "join": 6, "display": 6, "parallel": 6, "tutorials": 6, "__init__": 6,
}


def _layer(dotted: str) -> tuple[str, int]:
    """The LAYERS entry that names ``dotted`` most closely, and its layer."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in LAYERS:
            return name, LAYERS[name]
    raise KeyError(f"{dotted}: give it a layer in tests/unit/test_layers.py")


def _is_module(parts: list[str]) -> bool:
    """Whether ``parts`` name an nbdist module or package exactly."""
    path = PKG.joinpath(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(source: str, module: str) -> list[tuple[int, str]]:
    """(line, module under nbdist) for every nbdist import in ``source``, nested ones too;
    ``module`` is where the source lives, dotted under nbdist (``control.channel``)."""
    package = module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                target = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.startswith("nbdist."):
                target = node.module.split(".")[1:]
            else:
                continue
            names = [target + [a.name] if _is_module(target + [a.name]) else target
                     for a in node.names]
            found += sorted({(node.lineno, ".".join(n)) for n in names if n})
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".", 1)[1]) for a in node.names
                      if a.name.startswith("nbdist.")]
    return sorted(found)


def test_every_module_has_a_layer():
    tops = {p.relative_to(PKG).parts[0].removesuffix(".py") for p in PKG.rglob("*.py")}
    assert tops <= set(LAYERS), \
        f"give these a layer in tests/unit/test_layers.py: {tops - set(LAYERS)}"


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
    found = [t for _, t in _imports(source, "control.channel")]
    assert found == ["cluster.core", "display.live", "magics"]
    assert all(_layer(t)[1] > _layer("control.channel")[1] for t in found)
    assert _layer("output.rank_streams")[1] < _layer("output.router")[1]


def test_the_rooms_that_called_up_stand_below_their_callers():
    """The arrows that once ran up the house (issue 53) cannot come back on one layer: the
    notebook's sides of output, debugging and hosts stand below ``cluster``, the control
    channel below ``proc``, and the data they share at the bottom."""
    for lower, upper in [("output.receiver", "cluster.cells"),
                         ("output.rich_output", "cluster.core"),
                         ("debugging.prompts", "cluster.world"),
                         ("hosts.allocation", "cluster.session"),
                         ("control.protocol", "proc.worker"),
                         ("rank_info", "control.channel"), ("rank_config", "patches")]:
        assert _layer(lower)[1] < _layer(upper)[1], f"{lower} must stand below {upper}"


# -- circles ----------------------------------------------------------------------------------
def _module_of(parts: list[str]) -> str | None:
    """The nbdist module ``parts`` names (``cluster.core``; a package is its ``__init__``)."""
    while parts:
        if _is_module(parts):
            return ".".join(parts)
        parts = parts[:-1]
    return None


def _edges(path: Path) -> set[str]:
    """Every nbdist module ``path`` imports, at any depth (``TYPE_CHECKING`` ones too)."""
    package = list(path.relative_to(PKG).parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
            elif node.module and node.module.startswith("nbdist."):
                base = []
            else:
                continue
            target = base + (node.module.split(".") if node.module else [])
            if node.level == 0:
                target = target[1:]  # drop "nbdist"
            for alias in node.names:
                mod = _module_of(target + [alias.name]) or _module_of(target)
                if mod:
                    out.add(mod)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("nbdist."):
                    mod = _module_of(alias.name.split(".")[1:])
                    if mod:
                        out.add(mod)
    return out


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).with_suffix("")
        parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
        name = ".".join(parts) or "__init__"
        graph[name] = {m for m in _edges(path) if m != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_circles_of_imports():
    """Inside a package and across: ``TYPE_CHECKING`` and function-level imports count."""
    circles = _circles(_graph())
    assert not circles, "modules that import each other, directly or in a circle:\n" + \
        "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_finder_finds_circles():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


# -- imports by name --------------------------------------------------------------------------
#: Modules that import by a computed name, and why (never an nbdist module).
BY_NAME_ALLOWED = {
    "shipping/pickler.py": "a user's module, named by the pickle that refers to it",
    "patches/torch_private.py": "torch's own modules, named in its table of private names",
}


def _imports_by_name(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
        if name not in ("import_module", "__import__") or not node.args:
            continue
        arg = node.args[0]
        literal = arg.value if isinstance(arg, ast.Constant) else None
        if not isinstance(literal, str) or literal.startswith("nbdist"):
            found.append((node.lineno, ast.unparse(arg)))
    return found


def test_no_nbdist_module_is_imported_by_name():
    bad = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        if rel in BY_NAME_ALLOWED:
            continue
        bad += [f"nbdist/{rel}:{line} imports {arg}" for line, arg in
                _imports_by_name(path.read_text())]
    assert not bad, "import by name (import it, or register explicitly):\n" + "\n".join(bad)


def test_the_by_name_finder():
    src = ("import importlib\nimportlib.import_module('nbdist.telemetry.tracing')\n"
           "importlib.import_module(name)\nimportlib.import_module('torch.distributed')\n")
    assert [a for _, a in _imports_by_name(src)] == ["'nbdist.telemetry.tracing'", "name"]


# -- rooms ------------------------------------------------------------------------------------
#: ``global`` statements allowed in nbdist: state lives in an object that owns it
GLOBAL_BUDGET = 0


def test_no_two_modules_share_a_file_name():
    seen: dict[str, list[str]] = {}
    for path in PKG.rglob("*.py"):
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(path.relative_to(PKG).as_posix())
    assert not {n: p for n, p in seen.items() if len(p) > 1}, \
        f"rename one of each: { {n: p for n, p in seen.items() if len(p) > 1} }"


def test_schedulers_are_reached_only_through_the_door():
    """Only ``hosts/scheduler.py`` imports a scheduler module (``hosts/slurm.py``); the
    scheduler modules themselves import the interface they implement."""
    inner = {"hosts.slurm", "hosts.ray_placement"}
    allowed = {"hosts.scheduler"} | inner
    past = [f"{name} imports {', '.join(sorted(edges & inner))}"
            for name, edges in _graph().items() if edges & inner and name not in allowed]
    assert not past, "import schedulers from hosts/scheduler.py:\n" + "\n".join(past)


def test_one_module_raises_in_other_threads():
    """``thread_raise.py`` is the one caller of CPython's ``PyThreadState_SetAsyncExc``."""
    callers = sorted(p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")
                     if "PyThreadState_SetAsyncExc" in p.read_text())
    assert callers == ["thread_raise.py"], "raise in a thread with thread_raise.raise_in"


def test_the_global_budget_holds():
    count = sum(isinstance(n, ast.Global) for p in PKG.rglob("*.py")
                for n in ast.walk(ast.parse(p.read_text())))
    assert count <= GLOBAL_BUDGET, f"{count} `global` statements in nbdist, budget " \
        f"{GLOBAL_BUDGET}: keep the state in an object that owns it"


# -- docs/layout.md ------------------------------------------------------------------------------
LAYOUT_PAGE = ROOT / "docs" / "layout.md"


def _layout() -> str:
    return LAYOUT_PAGE.read_text().split("```", 2)[1]


def test_readme_layout_names_every_module_and_only_those():
    """docs/layout.md's block cannot drift: every module is in it, and nothing else."""
    layout = _layout()
    listed: set[str] = set()
    folder = ""
    for line in layout.splitlines()[1:]:
        head = re.match(r"\s{2}(\w+)/", line)
        if head:
            folder = head.group(1)
        elif re.match(r"\s{2}\S", line):
            folder = ""
        for name in re.findall(r"\b(\w+)\.py\b", line):
            listed.add(f"{folder}/{name}.py" if folder else f"{name}.py")
    modules = {p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")
               if p.name != "__init__.py"}
    assert modules - listed == set(), "modules missing from docs/layout.md"
    assert listed - modules == set(), "docs/layout.md names modules that do not exist"


# -- process-wide state ---------------------------------------------------------------------
def test_every_per_process_object_is_in_the_layout_list():
    """A module-level ``_..._PER_PROCESS`` object is allowed only where docs/layout.md's
    "Process-wide state" list names it, with why; a name the list gives exists."""
    section = LAYOUT_PAGE.read_text().split("## Process-wide state", 1)[1]
    listed = set(re.findall(r"`(_[A-Z_]+_PER_PROCESS)`", section))
    defined = {t.id for p in PKG.rglob("*.py") for n in ast.parse(p.read_text()).body
               if isinstance(n, (ast.Assign, ast.AnnAssign))
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
               if isinstance(t, ast.Name) and t.id.endswith("_PER_PROCESS")}
    assert defined - listed == set(), "per-process objects missing from docs/layout.md's list"
    assert listed - defined == set(), "docs/layout.md's list names objects that do not exist"


#: calls that make a mutable container: one in a class's body is shared by every instance
_CONTAINERS = {"dict", "list", "set", "deque", "OrderedDict", "defaultdict", "WeakSet",
               "WeakKeyDictionary", "WeakValueDictionary"}


#: calls whose result is not state: immutable values, types, functions, libraries
_NOT_STATE_CALLS = {"frozenset", "tuple", "compile", "namedtuple", "TypeVar", "object",
                    "getLogger", "Struct", "type", "CDLL", "sum", "dim_partitioner", "str",
                    "int", "float", "bytes", "Path", "MappingProxyType", "get"}
_MUTATORS = {"append", "add", "update", "pop", "popitem", "clear", "setdefault", "extend",
             "insert", "remove", "discard", "appendleft", "popleft", "sort"}
#: Files whose module-level objects are counted elsewhere: none since items 1-4 of issue 53
#: moved the pickler's and tracing's into their objects.
MODULE_STATE_ELSEWHERE: set[str] = set()
#: Module-level objects the finder takes for state that are not nbdist's state, and why.
NOT_STATE = {
    "control/protocol.py:_TAGS": "every message class by tag, complete once it is imported",
    "shipping/own_main.py:UNCHANGED": "a marker, without state",
    "patches/mp_spawn.py:DECLINE": "a marker, without state",
    "telemetry/tracing.py:_NO_WORLD": "what tracing reads between worlds: never armed or changed",
    "tutorials/batching.py:RESULTS": "the tutorial's own record (notebook 04 reads, clears it)",
}


def _module_state(source: str) -> list[tuple[int, str]]:
    """(line, name) of each module-level mutable object not named ``_..._PER_PROCESS``: an
    object made by a call (but ``_NOT_STATE_CALLS``), or a list, dict or set the module
    changes (a table it only reads is a constant)."""
    tree = ast.parse(source)
    changed = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(
                node.ctx, (ast.Store, ast.Del)) and isinstance(node.value, ast.Name):
            changed.add(node.value.id)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            changed.add(node.target.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in _MUTATORS and isinstance(node.func.value, ast.Name):
            changed.add(node.func.value.id)
    found = []
    for node in tree.body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        value, names = node.value, [t.id for t in targets if isinstance(t, ast.Name)]
        fn = value.func if isinstance(value, ast.Call) else None
        called = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
        made = fn is not None and called not in _NOT_STATE_CALLS
        table = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp,
                                   ast.SetComp))
        found += [(node.lineno, n) for n in names if not n.endswith("_PER_PROCESS")
                  and n != "__all__" and (made or (table and n in changed))]
    return found


def test_module_level_state_is_per_process_by_name():
    """A module-level mutable object is per process by its name (``_..._PER_PROCESS``, in
    docs/layout.md's list with why), or it is not there."""
    found = [f"{p.relative_to(PKG)}:{line} {name}" for p in sorted(PKG.rglob("*.py"))
             if p.relative_to(PKG).as_posix() not in MODULE_STATE_ELSEWHERE
             for line, name in _module_state(p.read_text())
             if f"{p.relative_to(PKG).as_posix()}:{name}" not in NOT_STATE]
    assert not found, f"{len(found)} module-level objects outside the rule:\n" + \
        "\n".join(found)


def test_the_module_state_finder_finds_it():
    src = ("import threading\n_lock = threading.Lock()\n_TABLE = {1: 2}\n_seen = {}\n"
           "_KEPT_PER_PROCESS = []\n_EMPTY = frozenset()\ndef f(k):\n    _seen[k] = 1\n"
           "    return _TABLE[k]\n_log = []\n_log.append(1)\n")
    assert _module_state(src) == [(2, "_lock"), (4, "_seen"), (10, "_log")]


def _class_attributes_set(source: str) -> list[tuple[int, str]]:
    """(line, ``Class.attr``) for each assignment to an attribute of a class the module
    defines at its top level, and each mutable container in a class's body (shared by its
    instances): the class used as a namespace of mutable state."""
    tree = ast.parse(source)
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    found = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in cls.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            fn = value.func if isinstance(value, ast.Call) else None
            called = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if isinstance(value, (ast.Dict, ast.List, ast.Set)) or called in _CONTAINERS:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found += [(node.lineno, f"{cls.name}.{t.id}") for t in targets
                          if isinstance(t, ast.Name)]
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for part in ast.walk(t):
                if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) \
                        and part.value.id in classes:
                    found.append((node.lineno, f"{part.value.id}.{part.attr}"))
    return found


#: Class attributes set on purpose, and why: none (state lives in objects of a scope).
CLASS_STATE_ALLOWED: dict[str, str] = {}


def test_no_class_is_used_as_a_namespace_of_mutable_state():
    """State lives in objects whose names say their scope (``_InWorld``, made at a world's
    join and dropped at its leave; ``_..._PER_PROCESS``), never in a class's attributes."""
    used = [f"{p.relative_to(PKG)}:{line} sets {what}" for p in PKG.rglob("*.py")
            for line, what in _class_attributes_set(p.read_text())
            if what not in CLASS_STATE_ALLOWED]
    assert not used, "\n".join(used)


def test_the_class_state_finder_finds_it():
    assert _class_attributes_set("class _S:\n    x = 0\ndef f():\n    _S.x = 1\n"
                                 "    _S.y += 2\n    a, _S.z = 1, 2\n") == \
        [(4, "_S.x"), (5, "_S.y"), (6, "_S.z")]
    assert _class_attributes_set("class _S:\n    x = 0\n_s = _S()\n_s.x = 1\n") == []
    assert _class_attributes_set("class _S:\n    a: dict = {}\n    b = weakref.WeakSet()\n"
                                 "    c = frozenset()\n") == [(2, "_S.a"), (3, "_S.b")]


# -- the architecture page --------------------------------------------------------------------
def test_the_architecture_page_names_what_exists():
    """docs/architecture.md cannot drift: every ``room/module.py`` it names is a file, and
    every ``room/module.Name.attr`` of a cell's round trip is there to import."""
    import importlib

    page = (ROOT / "docs" / "architecture.md").read_text()
    files = set(re.findall(r"\b((?:\w+/)?\w+\.py)\b", page))
    rooms = {p.name for p in PKG.iterdir() if p.is_dir()}
    missing = [f for f in files if "/" in f and f.split("/")[0] in rooms
               and not (PKG / f).is_file()]
    for room, module, attrs in re.findall(r"\b(\w+)/(\w+)((?:\.\w+)+)", page):
        if room not in rooms or attrs == ".py":
            continue
        obj = importlib.import_module(f"nbdist.{room}.{module}")
        for name in attrs.strip(".").split("."):
            if not hasattr(obj, name):
                missing.append(f"{room}/{module}{attrs}")
                break
            obj = getattr(obj, name)
    assert not missing, f"docs/architecture.md names what is not there: {missing}"


#: the folders of tests/, one per family (docs/development.md says what each holds)
TEST_FAMILIES = {"unit", "world", "kernel", "scripts", "notebooks", "hosts", "docs_site",
                 "browser", "conformance", "torch_rpc", "torch_c10d", "benchmarks"}


def _test_files_out_of_place(tests: Path) -> list[str]:
    """Test files at the top of ``tests``, in a folder that is not a family, or whose file
    name another test file has too (pytest imports each by its name alone)."""
    files = sorted(tests.rglob("test_*.py"))
    out = [str(p.relative_to(tests)) for p in files
           if p.parent == tests or p.relative_to(tests).parts[0] not in TEST_FAMILIES]
    seen: dict[str, Path] = {}
    for p in files:
        if p.name in seen:
            out.append(f"{p.relative_to(tests)} (and {seen[p.name].relative_to(tests)})")
        seen[p.name] = p
    return out


def test_tests_live_in_their_family_folders():
    assert not _test_files_out_of_place(ROOT / "tests")
    documented = (ROOT / "docs" / "development.md").read_text()
    assert all(f"`tests/{family}/`" in documented for family in TEST_FAMILIES)


def test_the_family_checker_sees_a_stray_and_a_twin(tmp_path):
    for rel in ("test_top.py", "misc/test_a.py", "unit/test_b.py", "world/test_b.py",
                "unit/test_ok.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert _test_files_out_of_place(tmp_path) == [
        "misc/test_a.py", "test_top.py", "world/test_b.py (and unit/test_b.py)"]
