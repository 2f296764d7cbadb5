"""reasonrl's modules import each other in layers, and without a cycle, whether an import sits at the
top of a module or inside a function.

A function-local import only defers loading (ray, vllm and other heavy or optional packages are
imported that way); between reasonrl's own modules it is still a dependency, and a cycle hidden in
a function is still a layer below reaching back up (e.g. a worker importing the loop's builders).
Imports under `if TYPE_CHECKING:` are for annotations only and do not count.

The graph is read from the source with `ast`, not by importing: `from reasonrl.x import y` is an
edge to module `reasonrl.x.y` when that is a module, else to `reasonrl.x`; relative imports are
resolved against the importing module's package. Importing a submodule also runs its package's
`__init__`, but that is not counted as an edge: a package re-exporting its submodules would
otherwise be a cycle with each of them.

On that graph a second rule: the modules lie in the layers of `LAYERS` (docs/architecture.md), and
an import goes to its own layer or one below, never up: the bottom (types, spec, registry, seeds, allocator),
models, the leaves (algo, sandbox, sampling, rewards, tasks, rollout, agents, eval), config, training
(with the guards' checks, the report, the server, distributed), methods, the loop (build,
participants, trainer), the stages, and the commands with the package's front door. What a lower part
needs from above is passed in (a factory, a callable).
"""

from __future__ import annotations

import ast
from pathlib import Path

import reasonrl

SOURCE = Path(reasonrl.__file__).parent


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its __init__)."""
    modules = {}
    for path in SOURCE.rglob("*.py"):
        parts = path.relative_to(SOURCE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The reasonrl modules that module `name` imports, at any depth but outside TYPE_CHECKING blocks."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if is_type_checking(child):
                for statement in child.orelse:
                    visit(statement)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    target = alias.name
                    while target and target not in modules:
                        target = target.rpartition(".")[0]
                    if target:
                        found.add(target)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package
                    for _ in range(child.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                for alias in child.names:
                    if f"{base}.{alias.name}" in modules:
                        found.add(f"{base}.{alias.name}")
                    elif base in modules:
                        found.add(base)
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    found.discard(name)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search for a back edge)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after
    path: list[str] = []

    def search(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (cycle := search(target)):
                return cycle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (cycle := search(module)):
            return cycle
    return None


# The layers, bottom first: a module may import its own layer and the ones below, never one above.
# What a lower part needs from above is passed in (a factory, a callable), not imported.
LAYERS = (
    ("bottom", ("reasonrl.types", "reasonrl.spec", "reasonrl.registry", "reasonrl.seeds", "reasonrl.allocator")),
    ("models", ("reasonrl.models",)),
    ("leaves", ("reasonrl.algo", "reasonrl.sandbox", "reasonrl.sampling", "reasonrl.rewards", "reasonrl.tasks",
                "reasonrl.rollout", "reasonrl.agents", "reasonrl.eval", "reasonrl.recipes")),
    ("config", ("reasonrl.config",)),
    ("training", ("reasonrl.training", "reasonrl.guards.alarms", "reasonrl.guards.watchdog", "reasonrl.report",
                  "reasonrl.serve", "reasonrl.distributed")),
    ("methods", ("reasonrl.methods",)),
    ("loop", ("reasonrl.build", "reasonrl.participants", "reasonrl.trainer", "reasonrl.guards")),
    ("stages", ("reasonrl.stages",)),
    ("commands", ("reasonrl.commands", "reasonrl")),
)


def is_in(module: str, names: tuple[str, ...]) -> bool:
    """Whether `module` is one of `names` or a submodule of one."""
    return any(module == name or module.startswith(f"{name}.") for name in names)


def layer_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> int | None:
    """The index of the layer `module` belongs to: the one naming the longest prefix of it."""
    best, length = None, -1
    for index, (_, names) in enumerate(layers):
        for name in names:
            if (module == name or module.startswith(f"{name}.")) and len(name) > length:
                best, length = index, len(name)
    return best


def upward_imports(graph: dict[str, set[str]],
                   layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> list[str]:
    """Every import of a module from a layer above its own, as "a (layer) -> b (layer)"."""
    found = []
    for module in sorted(graph):
        own = layer_of(module, layers)
        for target in sorted(graph[module]):
            if (theirs := layer_of(target, layers)) is not None and own is not None and theirs > own:
                found.append(f"{module} ({layers[own][0]}) -> {target} ({layers[theirs][0]})")
    return found


def test_the_graph_sees_top_level_function_local_and_relative_imports(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from . import b\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from pkg.c import thing\n")
    (tmp_path / "pkg" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n"
                                           "else:\n    import os\nimport pkg.a\n")
    modules = {"pkg": tmp_path / "pkg" / "__init__.py",
               **{f"pkg.{m}": tmp_path / "pkg" / f"{m}.py" for m in "abc"}}
    graph = {name: imported(name, path, modules) for name, path in modules.items()}
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    graph["pkg.c"] = set()
    assert find_cycle(graph) is None


def test_reasonrl_has_no_import_cycle():
    modules = module_names()
    graph = {name: imported(name, path, modules) for name, path in modules.items()}
    assert sum(map(len, graph.values())) > 100  # the graph was read, not silently empty
    cycle = find_cycle(graph)
    assert cycle is None, ("import cycle: " + " -> ".join(cycle or []) + ". Move what both need to a module "
                           "below them, or pass it in (a factory, a callable) instead of importing it")


def test_an_import_from_a_layer_above_is_found_and_the_longest_prefix_decides():
    layers = (("bottom", ("pkg.types",)), ("leaves", ("pkg.rollout", "pkg.loop.helpers")), ("loop", ("pkg.loop",)),
              ("top", ("pkg",)))
    graph = {"pkg": {"pkg.loop"}, "pkg.loop": {"pkg.rollout", "pkg.types"}, "pkg.loop.helpers": {"pkg.types"},
             "pkg.rollout": {"pkg.types"}, "pkg.types": set()}
    assert [layer_of(m, layers) for m in ("pkg.types", "pkg.loop.helpers", "pkg.loop", "pkg.other")] == [0, 1, 2, 3]
    assert upward_imports(graph, layers) == []
    graph["pkg.rollout"] = {"pkg.loop"}  # a leaf reaching up into the loop
    graph["pkg.types"] = {"pkg.loop.helpers"}
    assert upward_imports(graph, layers) == ["pkg.rollout (leaves) -> pkg.loop (loop)",
                                             "pkg.types (bottom) -> pkg.loop.helpers (leaves)"]


def test_every_module_has_a_layer_and_imports_only_its_own_and_the_ones_below():
    modules = module_names()
    graph = {name: imported(name, path, modules) for name, path in modules.items()}
    named = [name for _, names in LAYERS for name in names]
    assert all(any(is_in(module, (name,)) for module in modules) for name in named if name != "reasonrl.methods"), \
        "a layer names a module that does not exist"
    upward = upward_imports(graph)
    assert upward == [], (f"{len(upward)} imports go up the layers: " + "; ".join(upward[:8])
                          + ". Move what the lower module needs down, or pass it in (a factory, a callable)")
