"""Tier 1, issue 26: the house rules that keep the code readable, checked on the source itself.

The layers of ``collectives`` import only downwards (no circle, and no import inside a function
to dodge one); the programs (``trainer``, ``bench``) live on the public API; no file is over 350
lines and no function over 50.
"""
import ast
from pathlib import Path

import pytest

import collectives

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ring", "collectives", "trainer", "bench", "cmdline")
#: Imports inside functions that are there on purpose: importing these starts MPI or CUDA, or pulls
#: in an optional package, so they wait until they are needed.
LAZY = {"mpi4py", "cupy", "ring.transport.control", "ring.transport.mpi_setup", "matplotlib", "tensorboardX", "ml_dtypes",
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


def test_the_collectives_import_each_other_without_a_circle():
    graph = {}
    names = {module_name(p) for p in sources("collectives")}
    for path in sources("collectives"):
        name = module_name(path)
        graph[name] = {m if m in names else m.rsplit(".", 1)[0] for m, _ in imported(ast.parse(path.read_text()), False)
                       if m.startswith("collectives.")} - {name}
    modules = [m for m in graph if m != "collectives"]
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


@pytest.mark.parametrize("path", sources(*PACKAGES, "scripts"), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_file_over_350_lines_and_no_function_over_50(path):
    text = path.read_text()
    assert len(text.splitlines()) <= 350, f"{path.name}: {len(text.splitlines())} lines"
    long = [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(ast.parse(text))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 50]
    assert not long, f"{path.name}: functions over 50 lines: {long}"
