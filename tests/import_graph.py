"""The import graph of a package of ipupod, parsed from its source (function-level imports
included), and a cycle finder over it: what the structure tests check the layering with."""

import ast
import functools
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

__all__ = ["ALIASES", "find_cycle", "import_graph"]


#: the folder of a package's aliases (on the package's ``__path__``): its modules are
#: imported by their public paths, without this part
ALIASES = "_aliases"


def _module_name(path: Path) -> str:
    parts = [p for p in path.relative_to(REPO).with_suffix("").parts if p != ALIASES]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _reexports(init: Path, package: str) -> dict[str, str]:
    """Names a package's ``__init__`` imports from its submodules: name -> module."""
    found = {}
    for node in ast.walk(ast.parse(init.read_text(), str(init))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.startswith(package + "."):
            for alias in node.names:
                found[alias.asname or alias.name] = node.module
    return found


@functools.lru_cache(maxsize=None)
def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports anywhere in its body. ``from pkg
    import name`` counts as importing the module that defines ``name`` when the package
    re-exports it; the implicit import of parent packages is not counted (every submodule
    would otherwise form a cycle with its package's ``__init__``). Parsed once per test
    session (the tests only read it)."""
    paths = {_module_name(p): p for p in (REPO / package).rglob("*.py")}
    exports = {name: _reexports(path, name) for name, path in paths.items()
               if path.name == "__init__.py"}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = here.split(".")[:len(here.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in paths else
                                   exports.get(base, {}).get(alias.name, base))
            graph[name].update(t for t in targets if t in paths and t != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None
