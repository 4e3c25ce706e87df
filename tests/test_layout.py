"""Tier 1, issue 26: the house rules that keep the code readable, checked on the source itself.

The floors of ``collectives`` import only downwards (no circle, and no import inside a function
to dodge one; an import for annotations counts), the parameters at the calls' and the groups'
boundaries carry their types, what they ask of a transport is declared (ring/transport/base.py),
and the MPI and GPU transports do not import each other; the programs (``trainer``, ``bench``)
live on the public API; a file or a function far longer than any job here needs is a smell. The
tests share helpers only through support modules, say their tier, and wait on cues; no comment
logs an incident.
"""
import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import collectives
from tests.conftest import TIER
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


def imported_for_annotations(tree: ast.Module) -> list[tuple[str, int]]:
    """(module, line) of each import under ``if TYPE_CHECKING:`` at the top of a module: made for
    the annotations alone (a real import would close a circle), and a dependency all the same."""
    blocks = [node.body for node in tree.body
              if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")]
    return imported(ast.Module(body=[statement for block in blocks for statement in block], type_ignores=[]), False)


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
    """Imports for the annotations alone (``if TYPE_CHECKING:``) count: a type names a dependency."""
    names = {module_name(p) for p in sources("collectives")}
    upward = []
    for path in sources("collectives"):
        name = module_name(path)
        tree = ast.parse(path.read_text())
        for m, line in imported(tree, False) + imported_for_annotations(tree):
            if not m.startswith("collectives"):
                continue
            target = m if m in names else m.rsplit(".", 1)[0]
            if floor_of(target) > floor_of(name):
                upward.append(f"{name}:{line} imports {target} (a floor above)")
    assert not upward, "\n".join(upward)


#: The parameters of the calls and the groups that carry what a call runs on or through: the
#: runtime and its engine, a transport, a group, a call, a call's work.
BOUNDARY_PARAMETERS = {"runtime", "engine", "transport", "transports", "group", "g", "parent", "call", "work"}


def test_the_boundaries_of_the_calls_and_the_groups_carry_their_types():
    """In ``collectives/calls/`` and ``collectives/groups/`` every such parameter of a function is
    annotated, so that what it depends on is imported (for the annotations at least) and the layer
    rule above sees it; a group seen from the calls' floor is ``calls.group_protocol.CallGroup``."""
    untyped = [f"{module_name(path)}:{function.lineno} {function.name}({parameter.arg})"
               for path in sources("collectives/calls", "collectives/groups")
               for function in ast.walk(ast.parse(path.read_text()))
               if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
               for parameter in function.args.posonlyargs + function.args.args + function.args.kwonlyargs
               if parameter.arg in BOUNDARY_PARAMETERS and parameter.annotation is None]
    assert not untyped, "parameters at a floor's boundary without their type:\n" + "\n".join(untyped)


def declared_members(path: Path, *protocols: str) -> set[str]:
    """The fields and methods that the classes ``protocols`` of module ``path`` declare."""
    classes = [node for node in ast.parse(path.read_text()).body
               if isinstance(node, ast.ClassDef) and node.name in protocols]
    return {item.target.id if isinstance(item, ast.AnnAssign) else item.name for c in classes for item in c.body
            if isinstance(item, ast.AnnAssign) or isinstance(item, ast.FunctionDef)}


def test_what_collectives_asks_of_a_transport_is_declared():
    """Every member of a transport that ``collectives`` uses (``x.transport.member``, ``transport.member``,
    ``getattr(transport, "member", ...)``) is declared by ``Transport``, what every transport offers, or
    by ``MPIOnlyTransport``, what only the MPI transport does (ring/transport/base.py): a reader sees
    there what a new transport must offer."""
    declared = declared_members(ROOT / "ring/transport/base.py", "Transport", "MPIOnlyTransport")
    undeclared = []
    for path in sources("collectives"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and ast.unparse(node.value).split(".")[-1] == "transport":
                member = node.attr
            elif isinstance(node, ast.Call) and ast.unparse(node.func) == "getattr" and len(node.args) >= 2 \
                    and ast.unparse(node.args[0]).split(".")[-1] == "transport" \
                    and isinstance(node.args[1], ast.Constant):
                member = node.args[1].value
            else:
                continue
            if member not in declared:
                undeclared.append(f"{module_name(path)}:{node.lineno} .{member}")
    assert not undeclared, "transport members used but not declared in ring/transport/base.py:\n" + "\n".join(undeclared)


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


#: Not a size to write to: a file is split by meaning and is as long as its one job needs. These are
#: smells, far above any file or function here (the longest: about 500 and 70 lines), so that one
#: that reaches them is read again for a second job hiding in it.
FILE_SMELL_LINES, FUNCTION_SMELL_LINES = 1000, 120


@pytest.mark.parametrize("path", sources(*PACKAGES, "scripts"), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_file_or_function_is_long_enough_to_hold_two_jobs(path):
    text = path.read_text()
    assert len(text.splitlines()) <= FILE_SMELL_LINES, f"{path.name}: {len(text.splitlines())} lines"
    long = [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(ast.parse(text))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > FUNCTION_SMELL_LINES]
    assert not long, f"{path.name}: functions over {FUNCTION_SMELL_LINES} lines: {long}"


#: The runtime's failure state and who may write it (issue 37: one owner).
FAILURE_STATE = {"failure", "stopped_by", "stopped", "closed"}
FAILURE_OWNER = "collectives.calls.runtime"


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
    assert not wrong, "the failure state has one writer, collectives.calls.runtime.Runtime.stop:\n" + "\n".join(wrong)


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


TESTS = ROOT / "tests"


def test_no_test_module_imports_a_test_file_or_a_private_name_of_another():
    """What test files share lives in support modules (tests/support/, tests/worlds.py,
    tests/programs/cues.py, ...): no module under tests imports from a test file (``test_*.py``),
    nor a private name (``_name``) of another module under tests."""
    wrong = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
                private = [alias.name for alias in node.names if alias.name.startswith("_")]
                if node.module.rsplit(".", 1)[-1].startswith("test_") or private:
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} from {node.module} import "
                                 f"{', '.join(alias.name for alias in node.names)}")
            elif isinstance(node, ast.Import):
                wrong += [f"{path.relative_to(ROOT)}:{node.lineno} import {alias.name}" for alias in node.names
                          if alias.name.startswith("tests.") and alias.name.rsplit(".", 1)[-1].startswith("test_")]
    assert not wrong, "\n".join(wrong)


#: What launches a world from a test file: tests.worlds' launchers, the emulated hosts or Slurm, the
#: support modules that run programs under mpiexec, and PyTorch's suite on ring.
LAUNCHES = re.compile(r"\b(run_world|mpiexec|world_tests)\(|\"emulate_(hosts|slurm)\.sh\""
                      r"|from tests\.support\.(faults|hosts|trainer|strategies|bench) import|tests\.torch_suite")


def test_every_test_file_says_its_tier_and_a_tier_1_file_launches_no_world():
    """A test file's docstring begins with its tier (tests/conftest.py makes it the file's marker:
    ``-m tier1`` selects it); a file of tier 1 runs in one process."""
    wrong = []
    for path in sorted(TESTS.glob("test_*.py")):
        text = path.read_text()
        said = TIER.match(ast.get_docstring(ast.parse(text), clean=False) or "")
        if not said:
            wrong.append(f"{path.name}: its docstring does not begin with its tier (Tier 1, 2 or 3)")
        elif said.group(1) == "1" and LAUNCHES.search(text):
            wrong.append(f"{path.name}: tier 1, yet it launches a world: {LAUNCHES.search(text).group(0)!r}")
    assert not wrong, "\n".join(wrong)


def test_tests_wait_on_cues_not_on_sleeps():
    """A test or a test program that needs another process to reach a point waits for a cue from it
    (a message, a file, a process's end: tests/programs/cues.py), each wait bounded. So a sleep
    under tests is a poll's pause (a number of at most 0.2 s), a stand-in for for ever (3600 s), or
    a named duration that is itself what the test measures."""
    wrong = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("time.sleep", "sleep") and node.args \
                    and isinstance(node.args[0], ast.Constant) and not (node.args[0].value <= 0.2
                                                                        or node.args[0].value == 3600):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert not wrong, "\n".join(wrong)


#: How a comment logs an incident: how often something failed or was seen, and when.
INCIDENT = re.compile(r"\bused to\b|\b\d+ (of|in) (about )?\d+ runs\b|\b\d+ runs? (of|in) (about )?\d+|\bruns? (of|in) \d+\b"
                      r"|\bseen once\b|\bin (a|one) CI run\b|\bCI failed\b|\bin some runs\b|\bwas flaky\b", re.I)


def comments_and_docstrings(text: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a module's source."""
    found = [(token.start[0], token.string) for token in tokenize.generate_tokens(io.StringIO(text).readline)
             if token.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and ast.get_docstring(node, clean=False):
            found.append((node.body[0].lineno, ast.get_docstring(node, clean=False)))
    return found


def test_no_comment_logs_an_incident():
    """A comment or a docstring says why the code is as it is; how often something failed, in which
    run or since when is history, and belongs in the commit message (and in docs/ where a reader
    needs it)."""
    wrong = [f"{path.relative_to(ROOT)}:{line}: ...{text[max(0, m.start() - 50):m.end() + 30]!r}"
             for path in sources(*PACKAGES, "tests") for line, text in comments_and_docstrings(path.read_text())
             for m in [INCIDENT.search(text)] if m]
    assert not wrong, "\n".join(wrong)
