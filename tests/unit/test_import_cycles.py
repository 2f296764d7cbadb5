"""reasonrl's modules import each other in layers: no import cycle, whether an import sits at the
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

On that graph a second rule: nothing below the loop imports the loop. The loop is `reasonrl.trainer`,
its builders (`reasonrl.build`), its participants and the stages; above it sit only the package's
front door (`reasonrl`), the command line and the `eval` command. Every other module (types, config,
algo, rewards, tasks, sampling, rollout, agents, training, distributed, ...) must not reach the loop
through any chain of imports: what a part needs from above is passed in (a factory, a callable).
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


LOOP = ("reasonrl.trainer", "reasonrl.build", "reasonrl.participants", "reasonrl.guards.sync_check",
        "reasonrl.guards.alarm_participant",
        "reasonrl.stages")
ABOVE_THE_LOOP = ("reasonrl", "reasonrl.cli", "reasonrl.eval.command")


def is_in(module: str, names: tuple[str, ...]) -> bool:
    """Whether `module` is one of `names` or a submodule of one."""
    return any(module == name or module.startswith(f"{name}.") for name in names)


def import_chain(graph: dict[str, set[str]], start: str, targets: tuple[str, ...]) -> list[str] | None:
    """The shortest chain of imports [start, ..., target] from `start` to a module of `targets`, or
    None (breadth-first search)."""
    came_from: dict[str, str | None] = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for target in sorted(graph[module]):
                if target in came_from:
                    continue
                came_from[target] = module
                if is_in(target, targets):
                    chain = [target]
                    while (previous := came_from[chain[-1]]) is not None:
                        chain.append(previous)
                    return chain[::-1]
                following.append(target)
        frontier = following
    return None


def loop_imports_from_below(graph: dict[str, set[str]], loop: tuple[str, ...] = LOOP,
                            above: tuple[str, ...] = ABOVE_THE_LOOP) -> list[list[str]]:
    """For every module below the loop that reaches it, the chain of imports that does."""
    chains = []
    for module in sorted(graph):
        if module in above or is_in(module, loop):
            continue
        if chain := import_chain(graph, module, loop):
            chains.append(chain)
    return chains


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


def test_a_module_below_the_loop_that_reaches_it_is_found_with_its_chain():
    graph = {"pkg": {"pkg.trainer"}, "pkg.trainer": {"pkg.build", "pkg.training.learner"},
             "pkg.build": {"pkg.training.learner", "pkg.rollout"}, "pkg.training.learner": {"pkg.types"},
             "pkg.rollout": {"pkg.types"}, "pkg.types": set(), "pkg.cli": {"pkg.trainer"}}
    assert loop_imports_from_below(graph, loop=("pkg.trainer", "pkg.build"), above=("pkg", "pkg.cli")) == []
    graph["pkg.types"] = {"pkg.helpers"}
    graph["pkg.helpers"] = {"pkg.build"}  # a function-local import of a builder, two floors down
    assert loop_imports_from_below(graph, loop=("pkg.trainer", "pkg.build"), above=("pkg", "pkg.cli")) == [
        ["pkg.helpers", "pkg.build"],
        ["pkg.rollout", "pkg.types", "pkg.helpers", "pkg.build"],
        ["pkg.training.learner", "pkg.types", "pkg.helpers", "pkg.build"],
        ["pkg.types", "pkg.helpers", "pkg.build"],
    ]


def test_nothing_below_the_loop_imports_the_loop():
    modules = module_names()
    assert all(any(name == m or name.startswith(f"{m}.") for name in modules) for m in LOOP + ABOVE_THE_LOOP)
    graph = {name: imported(name, path, modules) for name, path in modules.items()}
    chains = loop_imports_from_below(graph)
    direct = [chain for chain in chains if len(chain) == 2]  # the imports to remove; the rest reach them
    assert not chains, (f"{len(chains)} modules below the loop import it, e.g. "
                        + "; ".join(" -> ".join(chain) for chain in (direct or chains)[:5])
                        + ". Pass what the lower module needs in (a factory, a callable) instead of importing it")
