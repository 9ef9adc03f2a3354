"""The package's shape (docs/architecture.md): each unit imports only what the package map's table allows it,
no import cycle between units nor between the modules of a unit, and the inference code never imports
training; README.md's layout lists every package. Read from the source with ``ast``, so nothing is imported;
imports inside functions count too, imports by string (``importlib.import_module``, lazy package exports) do
not."""

from __future__ import annotations

import ast
import re
from collections import deque
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dprobe"
# packages whose subpackages and modules are units of their own (coldstart vs jobscale, sidecar vs scaler)
SPLIT = ("dprobe.profiling", "dprobe.services")
INFERENCE = ("dprobe.forecaster.runtime", "dprobe.forecaster.loading", "dprobe.services")
ARCHITECTURE = ROOT / "docs" / "architecture.md"
README = ROOT / "README.md"
EVERYONE = frozenset({"dprobe"})  # the package itself (``__version__``): every unit may read it
TRAINING = ("pytorch_lightning", "lightning", "dprobe.training", "dprobe.forecaster.module")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
PACKAGES = {module_name(p) for p in PACKAGE.rglob("__init__.py")}


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


@cache
def imports(name: str, runtime_only: bool = False) -> frozenset[str]:
    """The modules ``name`` imports, at any level (``runtime_only``: leaving out ``if TYPE_CHECKING:``);
    ``from pkg import sub`` names the submodule when there is one."""
    package = name if name in PACKAGES else name.rpartition(".")[0]
    found: set[str] = set()
    todo: list[ast.AST] = [ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))]
    while todo:
        node = todo.pop()
        if runtime_only and _type_checking(node):
            todo.extend(node.orelse)  # type: ignore[attr-defined]
            continue
        todo.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULES else base)
    return frozenset(found)


def unit(module: str) -> str:
    """The unit ``module`` belongs to: ``dprobe.X``, or ``dprobe.X.Y`` under :data:`SPLIT`."""
    parts = module.split(".")
    return ".".join(parts[:3] if ".".join(parts[:2]) in SPLIT and len(parts) > 2 else parts[:2])


def unit_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], str]]:
    """Unit -> the units it imports, and for each such edge one import that makes it (``a imports b``)."""
    graph: dict[str, set[str]] = {unit(m): set() for m in MODULES}
    why: dict[tuple[str, str], str] = {}
    for module in MODULES:
        for target in sorted(imports(module)):
            if target.split(".")[0] != "dprobe" or unit(target) == unit(module):
                continue
            graph[unit(module)].add(unit(target))
            why.setdefault((unit(module), unit(target)), f"{module} imports {target}")
    return graph, why


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None when it is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def is_training(module: str) -> bool:
    return module.startswith(tuple(f"{t}." for t in TRAINING)) or module in TRAINING or "train" in module.split(".")


def import_chain(start: str, runtime_only: bool = True) -> list[str] | None:
    """The shortest chain of imports from ``start`` to a training module, or None. Importing a module runs
    its parent packages' ``__init__`` too, so those are followed as well."""
    parent = {start: ""}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        if is_training(module):
            chain = [module]
            while parent[chain[-1]]:
                chain.append(parent[chain[-1]])
            return chain[::-1]
        if module not in MODULES:
            continue
        parents = {module.rsplit(".", i)[0] for i in range(1, module.count(".") + 1)}
        for nxt in sorted(imports(module, runtime_only) | (parents & PACKAGES)):
            if nxt not in parent and (nxt in MODULES or is_training(nxt)):
                parent[nxt] = module
                queue.append(nxt)
    return None


def test_the_unit_graph_is_read_from_the_source():
    graph, why = unit_graph()
    assert {"dprobe.forecaster", "dprobe.evaluation", "dprobe.profiling.coldstart", "dprobe.services.sidecar",
            "dprobe.services.scaler", "dprobe.sim"} <= set(graph)
    assert "dprobe.forecaster" in graph["dprobe.evaluation"], why
    assert "dprobe.services.sources" in graph["dprobe.services.sidecar"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    assert is_training("dprobe.profiling.coldstart.train") and is_training("pytorch_lightning.core")
    assert not is_training("dprobe.training_data") and not is_training("dprobe.forecaster.runtime")


def test_no_import_cycle_between_units():
    graph, why = unit_graph()
    cycle = find_cycle(graph) or []
    assert not cycle, "import cycle between units: " + " -> ".join(cycle) + "\n" + "\n".join(
        why[a, b] for a, b in zip(cycle, cycle[1:], strict=False))


def test_inference_never_imports_training():
    starts = [m for m in MODULES if m in INFERENCE or m.startswith(tuple(f"{p}." for p in INFERENCE))]
    assert "dprobe.services.sidecar.service" in starts and "dprobe.forecaster.runtime" in starts
    inference = set(starts)
    chains = set()
    for start in starts:
        if chain := import_chain(start):  # from the last inference module on, so each path shows once
            last = max(i for i, m in enumerate(chain) if m in inference)
            chains.add(" -> ".join(chain[last:]))
    assert not chains, "inference imports training:\n" + "\n".join(sorted(chains))


# --- the package map: what each unit may import -----------------------------------------------------------


def package_map(text: str) -> list[tuple[list[str], str]]:
    """The rows of the "Package map" table in ``text``: (the unit cell's names, the "may import" cell). A unit cell
    with names in brackets (``dprobe.profiling`` (``predict``, ``cli``)) names the package and those modules."""
    section = text.split("## Package map", 1)[1].split("\n## ", 1)[0]
    lines = [line.strip() for line in section.splitlines() if line.strip().startswith("|")]
    assert lines and [c.strip() for c in lines[0].strip("|").split("|")] == ["unit", "holds", "may import"], \
        "docs/architecture.md: the package map's table should start | unit | holds | may import |"
    rows = []
    for line in lines[2:]:  # after the header and its --- row
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == 3, f"docs/architecture.md: a package map row needs 3 cells: {line}"
        head, _, subs = cells[0].partition("(")
        names = re.findall(r"`([^`]+)`", head)
        assert names, f"docs/architecture.md: no unit named in {cells[0]!r}"
        names += [f"{names[0]}.{sub}" for sub in re.findall(r"`([^`]+)`", subs)]
        rows.append((names, cells[2]))
    return rows


def allowed_units(cell: str, unit_name: str, units: set[str]) -> set[str]:
    """The units a "may import" cell allows ``unit_name``: names before the first ``;`` (what follows is
    not dprobe), brackets being notes; a name is ``dprobe.<name>``, or failing that a sibling of the unit
    (``sources`` under ``dprobe.services``); "nothing of dprobe"; "everything offline" (all but the services)."""
    text = re.sub(r"\([^)]*\)", "", cell.split(";", 1)[0]).strip()
    if text == "nothing of dprobe":
        return set()
    if text == "everything offline":
        return {u for u in units if u != "dprobe.services" and not u.startswith("dprobe.services.")}
    out = set()
    for name in (n.strip() for n in text.split(",")):
        candidates = [f"dprobe.{name}", f"{unit_name.rpartition('.')[0]}.{name}"]
        found = next((c for c in candidates if c in units), None)
        assert found, f"docs/architecture.md: the row of {unit_name} allows {name!r}, which is no unit of dprobe"
        out.add(found)
    return out


def layering_errors(graph: dict[str, set[str]], why: dict[tuple[str, str], str], text: str) -> list[str]:
    """Each import of a unit its row does not allow, each unit without a row and each row of no unit."""
    units = set(graph)
    rows = package_map(text)
    group = {name: names for names, _ in rows for name in names}  # the units of one row may import each other
    errors = [f"{name}: a row of the package map, but no unit of dprobe" for name in group if name not in units]
    errors += [f"{u}: a unit with no row in the package map (docs/architecture.md)" for u in sorted(units - set(group))]
    for names, cell in rows:
        for name in (n for n in names if n in units):
            allowed = allowed_units(cell, name, units) | set(group[name]) | EVERYONE
            errors += [f"{name} may not import {target} (its row allows: {cell}): {why[name, target]}"
                       for target in sorted(graph[name] - allowed)]
    return errors


def test_the_package_map_is_read_from_the_doc():
    text = ARCHITECTURE.read_text()
    rows = dict((names[0], cell) for names, cell in package_map(text))
    assert rows["dprobe.core"] == "nothing of dprobe" and "dprobe.scaling" in rows
    assert ["dprobe.profiling", "dprobe.profiling.predict", "dprobe.profiling.cli"] in [n for n, _ in package_map(text)]
    units = set(unit_graph()[0])
    assert allowed_units(rows["dprobe.services.scaler"], "dprobe.services.scaler", units) == {
        "dprobe.core", "dprobe.scaling", "dprobe.services.sources", "dprobe.services.exporter", "dprobe.sharing"}
    assert allowed_units(rows["dprobe.sharing"], "dprobe.sharing", units) == {"dprobe.core", "dprobe.data"}
    assert "dprobe.services.scaler" not in allowed_units(rows["dprobe.training"], "dprobe.training", units)
    # a violation, a unit without a row and a row without a unit are each named
    graph = {"dprobe.core": {"dprobe.data"}, "dprobe.data": {"dprobe.core"}, "dprobe.new": set()}
    table = ("## Package map\n\n| unit | holds | may import |\n| --- | --- | --- |\n"
             "| `dprobe.core` | x | nothing of dprobe |\n| `dprobe.data` | x | core |\n| `dprobe.gone` | x | core |\n")
    errors = layering_errors(graph, {("dprobe.core", "dprobe.data"): "dprobe.core.a imports dprobe.data.b"}, table)
    assert errors == ["dprobe.gone: a row of the package map, but no unit of dprobe",
                      "dprobe.new: a unit with no row in the package map (docs/architecture.md)",
                      "dprobe.core may not import dprobe.data (its row allows: nothing of dprobe): "
                      "dprobe.core.a imports dprobe.data.b"]


def test_units_import_only_what_the_package_map_allows():
    graph, why = unit_graph()
    errors = layering_errors(graph, why, ARCHITECTURE.read_text())
    assert not errors, "docs/architecture.md's package map and the code differ:\n" + "\n".join(errors)


# --- no import cycle between the modules of a unit ----------------------------------------------------------


def module_graph() -> dict[str, set[str]]:
    """Module -> the modules of its own unit it imports (inside functions too; ``if TYPE_CHECKING:`` left out,
    as it never runs). Python runs a cycle's modules half-imported, in an order that depends on which is
    imported first; a function-level import only hides the loop, so it counts."""
    return {m: {t for t in imports(m, runtime_only=True) if t in MODULES and t != m and unit(t) == unit(m)}
            for m in MODULES}


def test_no_import_cycle_between_the_modules_of_a_unit():
    cycle = find_cycle(module_graph()) or []
    assert not cycle, "import cycle between modules: " + " -> ".join(cycle) + " (move what both need into a " \
        "lower module)"


# --- README.md's layout ---------------------------------------------------------------------------------------


def test_the_readme_layout_lists_every_package():
    block = README.read_text().split("How the parts fit together", 1)[1].split("```", 2)[1]
    listed = {line.split()[0].rstrip("/") for line in block.splitlines() if line.startswith("dprobe/")}
    packages = {str(p.parent.relative_to(ROOT)) for p in PACKAGE.rglob("__init__.py")} - {"dprobe"}
    missing = sorted(p for p in packages if not any(x == p or x.startswith(f"{p}/") for x in listed))
    assert not missing, f"README.md's layout lists no line for {', '.join(missing)}"
