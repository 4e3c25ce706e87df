"""Tier 1, issue 60: the table of collectives (``collectives.calls.table``) is the one list of
their names; the module functions, the exports, a non-member's refusals, the frame's
floating-point guard, ``algorithm_for`` and the bench read it, and no other file keeps a list.
"""
import ast
import doctest
import inspect
from pathlib import Path

import pytest

import collectives as col
from collectives.calls import table
from collectives.groups.group import Group
from collectives.groups.membership import NonMember

pytestmark = pytest.mark.quick


def test_the_tables_examples_hold():
    result = doctest.testmod(table, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("name", table.NAMES)
def test_a_non_member_refuses_every_collective_by_name(name):
    """A rank left out of a group (``new_group``, ``split(None)``) gets a NonMember: any collective
    on it is this rank's CollectiveUsageError that says why, never an AttributeError, because the
    refusals are made from the table and not from a list of their own."""
    outside = NonMember((0, 1), 3)
    with pytest.raises(col.CollectiveUsageError, match=f"^{name}: group: rank 3 is not a member of group"):
        getattr(outside, name)()


def test_a_non_member_still_has_no_other_attribute():
    with pytest.raises(AttributeError):
        NonMember((0, 1), 3).transport


def test_every_collective_is_a_group_method_a_module_function_and_an_export():
    methods = {name for name, member in vars(Group).items() if inspect.isfunction(member) and
               not name.startswith("_") and "timeout" in inspect.signature(member).parameters}
    assert methods <= set(table.NAMES), f"Group methods missing from the table: {methods - set(table.NAMES)}"
    for name in table.NAMES:
        function = getattr(col, name)
        assert function.__name__ == name and name in col.__all__
        assert function.__doc__.startswith(getattr(Group, name).__doc__)
        assert "group" in inspect.signature(function).parameters


def test_the_sized_collectives_are_those_the_cost_model_chooses_for_and_the_bench_runs():
    from bench.cases import IMPLEMENTATIONS, OPS
    from ring.cost import ALGORITHMS
    assert table.SIZED == tuple(name for name in table.NAMES if name in ALGORITHMS) == OPS
    assert set(ALGORITHMS) <= set(table.NAMES), "the cost model chooses for a collective the table lacks"
    for impl in ("ring", "mpi", "gloo", "nccl"):
        assert set(IMPLEMENTATIONS[impl]) == set(OPS), f"the bench's {impl} lacks a sized collective"


ROOT = Path(__file__).resolve().parent.parent
#: The one file that lists collectives by name.
TABLE = ROOT / "collectives" / "calls" / "table.py"


def _listed_names(path) -> list[tuple[int, list[str]]]:
    """(line, names) of each literal tuple, list or set in ``path`` of two collectives' names or more
    and nothing else (torch's names, some the same as ours, come with others of torch's)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            names = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in table.BY_NAME]
            if len(names) >= 2 and len(names) == len(node.elts):
                found.append((node.lineno, names))
    return found


def test_no_file_but_the_table_lists_collectives_by_name():
    """A hand-written list of collective names drifts from the table (the non-member's refusals
    missed five). A dict from a name to its own body (the bench's implementations, the cost model's
    algorithms) is the collective's code, not a list, and is not counted."""
    lists = [f"{path.relative_to(ROOT)}:{line} lists {names}"
             for package in ("collectives", "ring", "trainer", "bench", "cmdline", "scripts")
             for path in sorted((ROOT / package).rglob("*.py")) if path != TABLE
             for line, names in _listed_names(path)]
    assert not lists, "read collectives.calls.table instead:\n" + "\n".join(lists)


def test_the_architecture_page_names_every_folder_and_module():
    """docs/architecture.md is the map: a folder or a module it does not name is one a reader cannot find."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    unnamed = [str(path.relative_to(ROOT)) for package in ("collectives", "ring", "trainer", "bench", "cmdline")
               for path in sorted((ROOT / package).rglob("*.py"))
               if (path.name != "__init__.py" and path.name not in page) or f"{path.parent.name}/" not in page]
    assert not unnamed, "docs/architecture.md does not name:\n" + "\n".join(unnamed)
