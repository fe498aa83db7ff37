"""The layers of `andrea/`: no circle of imports between its modules, and no import that runs back up.

Every import between two modules of the package counts, module-level and function-local alike: an
import hidden in a function is still a dependency (hiding it only moves an import-time circle to call
time). The layer of a module is the longest path of imports below it, a module that imports nothing
of andrea being layer 0, counting the imports Python runs when the module is imported (module-level
ones) and the entry points' per-command imports (andrea/cli.py imports a command's modules when the
command runs, so `andrea --help` does not load numpy, pandas and the engine: they are its
dependencies all the same). A function-local import elsewhere must then reach a module of a lower
layer; one that reaches the importer's layer or a higher one "runs back up": the kind of import
that held the old circles together (config > profiles > config, hub > fetch > hub, ...).

Pure ast, nothing of andrea imported: fast, and independent of the optional dependencies.
`python tests/test_import_layers.py [PACKAGE_DIR]` prints the figures for a review: modules,
layers, circles, back-up imports, function-local imports.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "andrea"
# modules whose function-local imports are their commands' (kept for start-up time, see above)
ENTRY_POINTS = ("andrea.cli", "andrea.__main__")
# function-local imports that run up on purpose, with the reason: what a process must not load when
# it imports the importer alone
KEPT_FOR_START_UP = {
    ("andrea.comm", "andrea.io"): "a one-rank run's andrea.comm loads no pyarrow (tests/test_comm.py); only rank 0 "
                                  "of a launch writes the rendezvous file",
    ("andrea.engine.fp8_records", "andrea.io"): "the engine reads the fp8 record at start-up and loads no pyarrow; "
                                                "only the bench tools write it",
}


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    imported: str  # dotted module name, a module of the package
    path: Path
    line: int
    local: bool  # inside a function (run when the function is called, not at import time)

    def where(self) -> str:
        """The file as written under the repository (andrea/config.py:12)."""
        folders = self.importer.split(".") if self.path.name == "__init__.py" else self.importer.split(".")[:-1]
        return f"{'/'.join(folders)}/{self.path.name}:{self.line}"


def package_modules(package_dir: Path = PACKAGE_DIR) -> dict[str, Path]:
    """Dotted name -> file of every module of the package (a package's __init__.py is the package)."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = [package_dir.name, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _targets(base: str, names: list[str], modules: dict[str, Path]) -> list[str]:
    """The package modules that `from base import names` reaches (`import base`: names empty): a name
    that is a submodule counts as that submodule, any other name as the deepest module `base` names."""
    found = [f"{base}.{n}" for n in names if f"{base}.{n}" in modules]
    if len(found) < len(names) or not names:
        parts = base.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        if parts:
            found.append(".".join(parts))
    return found


def package_imports(modules: dict[str, Path]) -> list[Import]:
    imports: list[Import] = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]

        def visit(node: ast.AST, local: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.Import):
                    targets = [t for alias in child.names for t in _targets(alias.name, [], modules)]
                elif isinstance(child, ast.ImportFrom):
                    if child.level:  # relative: from . import x, from ..a import b
                        anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                        base = ".".join(anchor + ([child.module] if child.module else []))
                    else:
                        base = child.module or ""
                    targets = _targets(base, [a.name for a in child.names], modules)
                else:
                    visit(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
                    continue
                imports.extend(Import(name, t, path, child.lineno, local) for t in dict.fromkeys(targets) if t != name)

        visit(tree, False)
    return imports


def circles(modules: list[str], imports: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in imports:
        graph[imp.importer].add(imp.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(sorted(graph[root])))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def structural(imports: list[Import]) -> list[Import]:
    """The imports that place a module in its layer: module-level ones, and the entry points' commands'."""
    return [i for i in imports if not i.local or i.importer in ENTRY_POINTS]


def layers(modules: list[str], imports: list[Import]) -> dict[str, int]:
    """Longest-path depth over the structural imports; the members of a circle share a layer (taken as
    one node), so the figure exists while circles remain."""
    imports = structural(imports)
    component = {m: m for m in modules}
    for members in circles(modules, imports):
        for m in members:
            component[m] = members[0]
    below: dict[str, set[str]] = {c: set() for c in component.values()}
    for imp in imports:
        if component[imp.importer] != component[imp.imported]:
            below[component[imp.importer]].add(component[imp.imported])
    depth: dict[str, int] = {}
    for start in below:  # iterative post-order: the condensation is a DAG
        work = [start]
        while work:
            node = work[-1]
            if node in depth:
                work.pop()
                continue
            todo = [n for n in below[node] if n not in depth]
            if todo:
                work += todo
            else:
                depth[node] = 1 + max((depth[n] for n in below[node]), default=-1)
                work.pop()
    return {m: depth[component[m]] for m in modules}


def back_up_imports(imports: list[Import], layer: dict[str, int]) -> list[Import]:
    """Imports that do not run down: to a module of the importer's layer or a higher one (but those
    kept for start-up time)."""
    return [i for i in imports if layer[i.imported] >= layer[i.importer] and (i.importer, i.imported) not in KEPT_FOR_START_UP]


def circle_imports(members: list[str], imports: list[Import]) -> list[Import]:
    inside = set(members)
    return [i for i in imports if i.importer in inside and i.imported in inside]


def circle_message(found: list[list[str]], imports: list[Import]) -> str:
    lines = []
    for members in found:
        lines.append(f"a circle of imports between {', '.join(members)}:")
        lines += [f"  {i.where()}: {i.importer} imports {i.imported}{' (in a function)' if i.local else ''}"
                  for i in circle_imports(members, imports)]
    return "\n".join(lines)


def back_up_message(up: list[Import], layer: dict[str, int]) -> str:
    return "imports that run back up, from a module to one of its own layer or a higher one (move the code down, " \
           "or pass the value in):\n" + "\n".join(
               f"  {i.where()}: {i.importer} (layer {layer[i.importer]}) imports {i.imported} (layer {layer[i.imported]})"
               for i in up)


def local_import_statements(modules: dict[str, Path]) -> tuple[Counter, Counter]:
    """Function-local import statements per module: (those of andrea modules, all of them)."""
    ours: Counter = Counter()
    every: Counter = Counter()
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        seen: set[int] = set()  # a nested function's imports are inside its enclosing one too
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in seen:
                    continue
                seen.add(id(node))
                every[name] += 1
                if isinstance(node, ast.Import):
                    ours[name] += any(a.name.split(".")[0] == "andrea" for a in node.names)
                else:
                    ours[name] += bool(node.level) or (node.module or "").split(".")[0] == "andrea"
    return ours, every


def report(package_dir: Path = PACKAGE_DIR) -> str:
    modules = package_modules(package_dir)
    names = list(modules)
    imports = package_imports(modules)
    layer = layers(names, imports)
    found = circles(names, imports)
    up = back_up_imports(imports, layer)
    ours, every = local_import_statements(modules)
    short = lambda m: m.removeprefix("andrea.")  # noqa: E731
    lines = [f"modules: {len(names)}", f"layers: {max(layer.values()) + 1}", f"circles: {len(found)}"]
    for members in found:
        lines.append(f"  {len(members)} modules: {' '.join(map(short, members))}")
    if found:
        lines.append(circle_message(found, imports))
    lines.append(f"back-up imports: {len(up)}")
    kept = [i for i in imports if (i.importer, i.imported) in KEPT_FOR_START_UP]
    lines += [f"  kept for start-up time: {i.where()}: {i.importer} imports {i.imported}" for i in kept]
    if up:
        lines.append(back_up_message(up, layer))
    cli = "andrea.cli"
    lines.append(f"function-local import statements of andrea modules: {sum(ours.values()) - ours[cli]} in andrea/ "
                 f"besides cli.py, {ours[cli]} in cli.py")
    lines.append(f"function-local import statements of anything (stdlib, optional dependencies too): "
                 f"{sum(every.values()) - every[cli]} besides cli.py, {every[cli]} in cli.py")
    for module, count in ours.most_common():
        if count and module != cli:
            lines.append(f"  {module}: {count}")
    lines.append("layers, bottom up:")
    for depth in range(max(layer.values()) + 1):
        lines.append(f"  {depth}: {' '.join(sorted(short(m) for m in names if layer[m] == depth))}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- the checks CI runs


def test_no_circle_of_modules():
    modules = package_modules()
    imports = package_imports(modules)
    found = circles(list(modules), imports)
    assert not found, circle_message(found, imports)


def test_no_import_runs_back_up():
    modules = package_modules()
    imports = package_imports(modules)
    layer = layers(list(modules), imports)
    up = back_up_imports(imports, layer)
    assert not up, back_up_message(up, layer)


def test_the_checks_find_a_circle_and_a_back_up_import_and_name_file_and_line(tmp_path):
    """The checks on a package made for them: a circle closed by a function-local import (and a
    relative one), and a function-local import into a higher layer."""
    pkg = tmp_path / "andrea"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("import json\n\n\ndef f():\n    from andrea.high import g\n    return g\n")
    (pkg / "high.py").write_text("from andrea import low\n\n\ndef g():\n    pass\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from . import b\n")
    (pkg / "sub" / "b.py").write_text("def h():\n    from .a import x\n")
    (pkg / "leaf.py").write_text("")
    (pkg / "top.py").write_text("import andrea.leaf\nfrom andrea.high import g\n\n\ndef k():\n    from andrea import mid\n")
    (pkg / "mid.py").write_text("from andrea import top\n")  # a circle top > mid > top, closed in a function
    modules = package_modules(pkg)
    imports = package_imports(modules)
    assert {(i.importer, i.imported, i.line, i.local) for i in imports} == {
        ("andrea.low", "andrea.high", 5, True), ("andrea.high", "andrea.low", 1, False),
        ("andrea.sub.a", "andrea.sub.b", 1, False), ("andrea.sub.b", "andrea.sub.a", 2, True),
        ("andrea.top", "andrea.leaf", 1, False), ("andrea.top", "andrea.high", 2, False),
        ("andrea.top", "andrea.mid", 6, True), ("andrea.mid", "andrea.top", 1, False)}
    found = circles(list(modules), imports)
    assert found == [["andrea.high", "andrea.low"], ["andrea.mid", "andrea.top"], ["andrea.sub.a", "andrea.sub.b"]]
    assert "low.py:5: andrea.low imports andrea.high (in a function)" in circle_message(found, imports)
    layer = layers(list(modules), imports)
    assert layer["andrea.low"] == 0 and layer["andrea.high"] == 1 and layer["andrea.mid"] == 3
    up = back_up_imports(imports, layer)
    assert ("andrea.low", "andrea.high", 5) in {(i.importer, i.imported, i.line) for i in up}
    assert "low.py:5: andrea.low (layer 0) imports andrea.high (layer 1)" in back_up_message(up, layer)
    # the same package without its closing imports: nothing to report
    (pkg / "low.py").write_text("import json\n")
    (pkg / "sub" / "b.py").write_text("")
    (pkg / "top.py").write_text("import andrea.leaf\nfrom andrea.high import g\n\n\ndef k():\n    from andrea import leaf\n")
    imports = package_imports(modules)
    assert circles(list(modules), imports) == []
    assert back_up_imports(imports, layers(list(modules), imports)) == []


if __name__ == "__main__":
    print(report(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else PACKAGE_DIR))
