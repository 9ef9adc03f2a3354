"""The package's shape (docs/architecture.md): no import cycle between its units, and the inference code
never imports training. Read from the source with ``ast``, so nothing is imported; imports inside functions
count too, imports by string (``importlib.import_module``, lazy package exports) do not."""

from __future__ import annotations

import ast
from collections import deque
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dprobe"
# packages whose subpackages and modules are units of their own (coldstart vs jobscale, sidecar vs scaler)
SPLIT = ("dprobe.profiling", "dprobe.services")
INFERENCE = ("dprobe.forecaster.runtime", "dprobe.forecaster.loading", "dprobe.services")
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
