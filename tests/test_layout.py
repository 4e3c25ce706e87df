"""Tier 1, issue 26: the house rules that keep the code readable, checked on the source itself.

The floors of ``collectives`` import only downwards (no circle, and no import inside a function
to dodge one), and the MPI and GPU transports not each other; the programs (``trainer``, ``bench``) live on the public API; no file is over 350
lines and no function over 50.
"""
import ast
import re
from pathlib import Path

import pytest

import collectives
from tests.streams import NAMESPACES, ONE_STREAM

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ring", "collectives", "trainer", "bench", "cmdline")
#: Imports inside functions that are there on purpose: importing these starts MPI or CUDA, or pulls
#: in an optional package, so they wait until they are needed.
LAZY = {"mpi4py", "cupy", "ring.transport.mpi.control", "ring.transport.mpi.setup", "ring.transport.mpi.survivors", "matplotlib", "tensorboardX", "ml_dtypes",
        "torch"}


def sources(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py"))


def imported(tree: ast.AST, inside_functions: bool) -> list[tuple[str, int]]:
    """(module, line) of each import, at the top of the module or inside functions."""
    found = []
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    nodes = [n for f in functions for n in ast.walk(f)] if inside_functions else tree.body
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def test_no_module_imports_another_in_a_circle():
    """Over every package (ring, collectives, the programs): no import circle at the modules' tops
    (a package's ``__init__`` that gathers its modules' public names is not a node of its own)."""
    graph = {}
    names = {module_name(p) for p in sources(*PACKAGES)}
    for path in sources(*PACKAGES):
        name = module_name(path)
        graph[name] = {m if m in names else m.rsplit(".", 1)[0] for m, _ in imported(ast.parse(path.read_text()), False)
                       if m.split(".")[0] in PACKAGES} - {name}
    modules = [m for m in graph if m not in PACKAGES]
    state: dict = {}

    def visit(node: str, trail: list[str]) -> None:
        if state.get(node) == "done" or node not in graph:
            return
        assert state.get(node) != "open", f"import circle: {' -> '.join(trail + [node])}"
        state[node] = "open"
        for nxt in sorted(graph[node]):
            visit(nxt, trail + [node])
        state[node] = "done"

    for m in modules:
        visit(m, [])


#: The floors of ``collectives``, lowest first: a module imports only from its own floor or below
#: (docs/architecture.md draws them). The face (the package's ``__init__``, ``about``, ``__main__``)
#: sits above all but the torch backend, an adapter on the public API.
FLOORS = [("collectives.errors",), ("collectives.calls",), ("collectives.ops",), ("collectives.groups",),
          ("collectives.process",), ("collectives.api", "collectives.p2p"), ("collectives.elastic",),
          ("collectives", "collectives.about", "collectives.__main__"), ("collectives.torch",)]


def floor_of(module: str) -> int:
    """The floor of a module of ``collectives``: its longest matching prefix's."""
    best = max((prefix for floor in FLOORS for prefix in floor
                if module == prefix or module.startswith(prefix + ".")), key=len)
    return next(k for k, floor in enumerate(FLOORS) if best in floor)


def test_each_floor_of_collectives_imports_only_its_own_or_those_below():
    names = {module_name(p) for p in sources("collectives")}
    upward = []
    for path in sources("collectives"):
        name = module_name(path)
        for m, line in imported(ast.parse(path.read_text()), False):
            if not m.startswith("collectives"):
                continue
            target = m if m in names else m.rsplit(".", 1)[0]
            if floor_of(target) > floor_of(name):
                upward.append(f"{name}:{line} imports {target} (a floor above)")
    assert not upward, "\n".join(upward)


def test_the_gpu_and_mpi_transports_do_not_import_each_other():
    crossing = [f"{module_name(p)}:{line} imports {m}" for side, other in (("mpi", "gpu"), ("gpu", "mpi"))
                for p in sources(f"ring/transport/{side}")
                for m, line in imported(ast.parse(p.read_text()), False) + imported(ast.parse(p.read_text()), True)
                if m.startswith(f"ring.transport.{other}")]
    assert not crossing, "\n".join(crossing)


@pytest.mark.parametrize("path", sources(*PACKAGES), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_import_inside_a_function_but_the_lazy_ones(path):
    late = [(m, line) for m, line in imported(ast.parse(path.read_text()), True)
            if not any(m == lazy or m.startswith(lazy + ".") for lazy in LAZY)]
    assert not late, f"{path.name}: imports inside functions: {late}"


@pytest.mark.parametrize("package", ["trainer", "bench"])
def test_the_programs_use_only_the_public_api(package):
    below = []
    for path in sources(package):
        for m, line in imported(ast.parse(path.read_text()), False) + imported(ast.parse(path.read_text()), True):
            public = m == "collectives" or m.startswith("collectives.") and m.count(".") == 1 and \
                m.split(".")[1] in collectives.__all__
            if m.startswith("ring") and not (path.name == "model.py" and m == "ring.cost"):   # (bench --model fits it)
                below.append(f"{path.name}:{line} {m}")
            elif m.startswith("collectives") and not public:
                below.append(f"{path.name}:{line} {m}")
    assert not below, f"{package} reaches below the public API: {below}"


#: Where the rule of size bends for the design, each with its reason.
LONGER_FUNCTIONS = {
    # every small collective's check and recursive doubling in one Python call: the call budget
    # (scripts/call_budget.py) counts the latency path's calls, and a helper for the body costs one more
    ("doubling.py", "agree"): 75,
}


@pytest.mark.parametrize("path", sources(*PACKAGES, "scripts"), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_file_over_350_lines_and_no_function_over_50(path):
    text = path.read_text()
    assert len(text.splitlines()) <= 350, f"{path.name}: {len(text.splitlines())} lines"
    long = [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(ast.parse(text))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > LONGER_FUNCTIONS.get((path.name, n.name), 50)]
    assert not long, f"{path.name}: functions over 50 lines: {long}"


#: The runtime's failure state and who may write it (issue 37: one owner).
FAILURE_STATE = {"failure", "stopped_by", "stopped", "closed"}
FAILURE_OWNER = "collectives.process.runtime"


def attribute_writes(tree: ast.AST) -> list[tuple[ast.Attribute, int]]:
    """Every ``something.attr = ...`` (plain, augmented or annotated) in ``tree``, with its line."""
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store):
                    found.append((t, node.lineno))
    return found


def test_only_the_runtime_writes_the_failure_state():
    """``Runtime.stop`` is the one writer of ``failure`` (and its record and event; ``Runtime.leave``
    of ``closed``); the rest read."""
    wrong = [f"{module_name(path)}:{line} writes .{t.attr}"
             for path in sources(*PACKAGES) if module_name(path) != FAILURE_OWNER
             and not module_name(path).startswith("ring.")   # (below the runtime: its names are the ring's own)
             for t, line in attribute_writes(ast.parse(path.read_text())) if t.attr in FAILURE_STATE]
    assert not wrong, "the failure state has one writer, collectives.process.runtime.Runtime.stop:\n" + "\n".join(wrong)


#: A group's counters and state, and their one owner (issue 47).
GROUP_STATE, GROUP_OWNER = {"seq", "last", "destroyed"}, "collectives.groups.group"


def test_only_the_group_writes_its_counters():
    wrong = [f"{module_name(path)}:{line} writes {ast.unparse(t)}"
             for path in sources("collectives") if module_name(path) != GROUP_OWNER
             for t, line in attribute_writes(ast.parse(path.read_text()))
             if t.attr in GROUP_STATE and ast.unparse(t.value) != "self"]
    assert not wrong, "a group's counters have one writer, Group:\n" + "\n".join(wrong)


def test_no_module_sets_another_modules_globals_or_a_transports_fields():
    """A module's globals are set by that module (through a function of its own, like
    ``ring.execute.observe``), and a transport's fields by the transport: callers pass values (a
    wait takes its call's ``Bound``), they do not write ``transport.deadline`` before it."""
    wrong = []
    for path in sources(*PACKAGES):
        tree = ast.parse(path.read_text())
        modules = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                   for alias in node.names}
        modules |= {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    for alias in node.names if node.module and f"{node.module}.{alias.name}" in _MODULES}
        in_transport = module_name(path).startswith("ring.transport")
        for t, line in attribute_writes(tree):
            owner = t.value
            if isinstance(owner, ast.Name) and owner.id in modules and ast.unparse(t) not in _HOOKS:
                wrong.append(f"{module_name(path)}:{line} sets {owner.id}.{t.attr}")
            elif not in_transport and ast.unparse(owner).split(".")[-1] in ("transport", "host", "level"):
                wrong.append(f"{module_name(path)}:{line} sets {ast.unparse(t)}")
    assert not wrong, "\n".join(wrong)


_MODULES = {module_name(p) for p in sources(*PACKAGES)} | {"mpi4py.rc"}
_HOOKS = {"sys.excepthook"}   # (Python's own way in: set, and put back, by the one that installs it)


def test_importing_the_library_does_not_start_mpi():
    """``col.elastic.supervise()`` must run before MPI starts (it forks the rank): importing
    ``collectives`` (and its torch backend) may not import ``mpi4py.MPI``, which initializes MPI."""
    import subprocess
    import sys
    probe = "import sys, collectives, collectives.elastic; print('mpi4py.MPI' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parent.parent)
    assert result.stdout.strip() == "False", result.stdout + result.stderr


def test_files_whose_tests_share_state_run_in_one_stream():
    """Under -n (tests/streams.py) a file whose tests share a module fixture, or which makes network
    namespaces (emulated hosts, the emulated Slurm cluster), must be one stream's, in order; a file
    named there must exist (a renamed file would otherwise go out test by test)."""
    makes_namespaces = re.compile(r'"emulate_(hosts|slurm)\.sh"|from tests\.support\.hosts import \(?[^)\n]*\b(SCRIPT|emulated_hosts)\b')
    module_fixture = re.compile(r'@pytest\.fixture\([^)]*scope="module"')
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        name, text = f"tests/{path.name}", path.read_text()
        if makes_namespaces.search(text):
            assert ONE_STREAM.get(name) == NAMESPACES, name
        elif module_fixture.search(text):
            assert ONE_STREAM.get(name) == name, name
    assert all((ROOT / name).is_file() for name in ONE_STREAM), ONE_STREAM
