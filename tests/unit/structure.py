"""A package's structure read from its source (``ast``, nothing imported): its modules, the
imports between them, its classes and what they inherit. The architecture tests state
their rules over it (``test_broker_structure.py`` for ``services/broker``); any package
can be read the same way (``Package.load(ROOT, "sdk/txmq", "txmq")``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

#: Methods that may call ``super()``: construction, not behaviour.
CONSTRUCTORS = frozenset({"__init__", "__new__", "__init_subclass__", "__post_init__"})


@dataclass(frozen=True)
class Import:
    module: str
    #: The module imported from (absolute, dotted).
    target: str
    #: The names imported from it (empty for ``import x``).
    names: tuple[str, ...]
    line: int
    #: Inside a function or method (hidden from the module's top).
    in_function: bool


@dataclass
class ClassInfo:
    module: str
    name: str
    line: int
    lines: int
    #: Each base as the dotted name it resolves to (``services.broker.checks.ChecksPart``),
    #: or as written when it is not resolvable (``Exception``).
    bases: list[str]
    #: Methods that call ``super()`` (other than constructors).
    super_calls: list[str] = field(default_factory=list)

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"


class Package:
    def __init__(self, name: str, modules: dict[str, ast.Module], paths: dict[str, Path]) -> None:
        self.name = name
        self.trees = modules
        self.paths = paths
        self.imports = [imp for module in modules for imp in self._imports(module)]
        self.classes = [c for module in modules for c in self._classes(module)]

    @classmethod
    def load(cls, repo: Path, directory: str, package: str) -> Package:
        """Every module under ``repo/directory``, named as ``package`` dotted paths."""
        root = repo / directory
        trees, paths = {}, {}
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([package, *parts])
            trees[name] = ast.parse(path.read_text(), str(path))
            paths[name] = path
        return cls(package, trees, paths)

    # --- reading ---------------------------------------------------------------------------

    def _is_package(self, module: str) -> bool:
        return self.paths[module].name == "__init__.py"

    def _resolve(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = module.split(".")
        if not self._is_package(module):
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join([*base, *([node.module] if node.module else [])])

    def _imports(self, module: str) -> list[Import]:
        found = []
        for node, in_function in _walk(self.trees[module]):
            if isinstance(node, ast.ImportFrom):
                target = self._resolve(module, node)
                found.append(Import(module, target, tuple(a.name for a in node.names), node.lineno, in_function))
                for alias in node.names:  # ``from . import codec`` imports a module
                    if f"{target}.{alias.name}" in self.trees:
                        found.append(Import(module, f"{target}.{alias.name}", (), node.lineno, in_function))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    found.append(Import(module, alias.name, (), node.lineno, in_function))
        return found

    def _bindings(self, module: str) -> dict[str, str]:
        """Module-level names → the dotted name they stand for (imports and classes)."""
        out = {}
        tree = self.trees[module]
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                target = self._resolve(module, node)
                for alias in node.names:
                    out[alias.asname or alias.name] = f"{target}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:  # ``import a.b as c``: c is a.b
                        out[alias.asname] = alias.name
                    else:  # ``import a.b``: a is a
                        out[alias.name.split(".")[0]] = alias.name.split(".")[0]
            elif isinstance(node, ast.ClassDef):
                out[node.name] = f"{module}.{node.name}"
        return out

    def _classes(self, module: str) -> list[ClassInfo]:
        bindings = self._bindings(module)
        out = []
        for node in ast.walk(self.trees[module]):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = []
            for base in node.bases:
                text = ast.unparse(base)
                head, _, rest = text.partition(".")
                bases.append(bindings[head] + (f".{rest}" if rest else "") if head in bindings else text)
            info = ClassInfo(module, node.name, node.lineno, (node.end_lineno or node.lineno) - node.lineno + 1, bases)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name not in CONSTRUCTORS \
                        and any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "super"
                                for n in ast.walk(item)):
                    info.super_calls.append(item.name)
            out.append(info)
        return out

    # --- what the rules ask ----------------------------------------------------------------

    def internal(self, name: str) -> bool:
        return name == self.name or name.startswith(self.name + ".")

    def module_of(self, dotted: str) -> str | None:
        """The package's module a dotted name lies in (itself, or the module defining it)."""
        while dotted:
            if dotted in self.trees:
                return dotted
            dotted = dotted.rpartition(".")[0]
        return None

    def import_graph(self) -> dict[str, set[str]]:
        """Module → the package's modules it imports (at its top or inside functions)."""
        graph: dict[str, set[str]] = {m: set() for m in self.trees}
        for imp in self.imports:
            target = self.module_of(imp.target) if self.internal(imp.target) else None
            if target is not None and target != imp.module and not self._is_ancestor(target, imp.module):
                graph[imp.module].add(target)
        return graph

    def _is_ancestor(self, target: str, module: str) -> bool:
        """A package's ``__init__`` is imported by its own modules implicitly: not an edge."""
        return self._is_package(target) and module.startswith(target + ".")

    def import_cycles(self) -> list[list[str]]:
        """Every set of modules that import each other, directly or round a circle (Tarjan)."""
        graph = self.import_graph()
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        cycles: list[list[str]] = []

        def visit(node: str) -> None:
            index[node] = low[node] = len(index)
            stack.append(node)
            on_stack.add(node)
            for nxt in sorted(graph[node]):
                if nxt not in index:
                    visit(nxt)
                    low[node] = min(low[node], low[nxt])
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))

        for node in sorted(graph):
            if node not in index:
                visit(node)
        return cycles

    def function_imports(self) -> list[Import]:
        return [imp for imp in self.imports if imp.in_function]

    def private_imports(self) -> list[Import]:
        """Imports of another module's private names (``from .x import _y``), the package's
        own or a sibling package's."""
        return [imp for imp in self.imports
                if any(_private(n) for n in imp.names) and imp.target != imp.module]

    def private_attribute_reads(self) -> list[tuple[str, int, str]]:
        """``x._y`` where ``x`` is a module the file imported (a sibling's private name)."""
        out = []
        for module, tree in self.trees.items():
            modules = {name for name, target in self._bindings(module).items()
                       if self.internal(target) and target in self.trees}
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                        and node.value.id in modules):
                    out.append((module, node.lineno, ast.unparse(node)))
        return out

    def inheritance_within(self) -> list[tuple[ClassInfo, str]]:
        """(class, base) where the base is another class of the package (not an exception)."""
        own = {c.qualname: c for c in self.classes}
        return [(c, base) for c in self.classes for base in c.bases
                if base in own and not self._is_exception(own[base], own)]

    def _is_exception(self, cls: ClassInfo, own: dict[str, ClassInfo]) -> bool:
        for base in cls.bases:
            if base in own:
                if self._is_exception(own[base], own):
                    return True
            elif base.rpartition(".")[2].endswith(("Error", "Exception")):
                return True
        return False


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _walk(tree: ast.Module) -> list[tuple[ast.AST, bool]]:
    """Every node with whether it lies inside a function."""
    out: list[tuple[ast.AST, bool]] = []

    def go(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            out.append((child, in_function))
            go(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    go(tree, False)
    return out
