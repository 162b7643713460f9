"""The package layout of DESIGN.md: imports point down, no heavy imports at import time."""

import ast
import re
import subprocess
import sys

import pytest

from tests.import_graph import ALIASES, REPO, find_cycle, import_graph

PACKAGES = ("popdist", "poprun", "launch", "collectives", "ipu_node", "protos", "poptorch",
            "ipu_tensorflow")
# DESIGN.md: poprun -> launch -> protos, poprun -> ipu_node, collectives -> ipu_node,
# collectives -> protos, launch -> protos; popdist (Graphcore's name for the PopDist API) is a
# thin layer over poprun.popdist (and popdist.poptorch over poptorch), and nothing of ipupod
# imports it; the front end poptorch sits on top: poptorch -> collectives, ipu_node, poprun;
# and the TF front end the same way: ipu_tensorflow -> collectives, ipu_node, poprun (it
# serves horovod.tensorflow over collectives.horovod, not over poptorch).
ALLOWED = {
    "ipu_tensorflow": {"collectives", "ipu_node", "poprun"},
    "popdist": {"poprun", "poptorch"},
    "poptorch": {"collectives", "ipu_node", "poprun"},
    "poprun": {"launch", "protos", "ipu_node"},
    "launch": {"protos"},
    "collectives": {"ipu_node", "protos"},
    "ipu_node": set(),
    "protos": set(),
}


def _imported_packages(package: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (REPO / package).rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in PACKAGES and top != package:
                    found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_down(package):
    imported = _imported_packages(package)
    wrong = {p: files for p, files in imported.items() if p not in ALLOWED[package]}
    assert not wrong, f"{package} may not import {sorted(wrong)}: {wrong}"


@pytest.mark.slow
def test_importing_the_packages_loads_neither_mpi_nor_grpc():
    code = ("import sys, collectives, collectives.strategies, ipu_node, poprun, launch, popdist,"
            " popdist.tensorflow;"
            "bad = [m for m in ('mpi4py', 'mpi4py.MPI', 'grpc') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_only_poptorch_imports_torch():
    code = ("import sys, ipu_node, collectives, collectives.strategies, poprun, launch, popdist,"
            " popdist.tensorflow; print([m for m in ('torch',) if m in sys.modules]);"
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr


#: the packages of ipupod that import TensorFlow (the TF front end alone; tests aside)
TF_PACKAGES = ("ipu_tensorflow",)


@pytest.mark.slow
def test_only_the_tf_front_end_imports_tensorflow():
    """``import ipu_node, collectives, poprun, popdist, poptorch`` (and the finder of the
    served names, which every process of the environment imports) load no TensorFlow."""
    code = ("import sys, ipupod_aliases, ipu_node, collectives, collectives.strategies, "
            "collectives.horovod, poprun, launch, popdist, popdist.tensorflow, "
            "ipu_tensorflow;"
            "import importlib.util as u; "
            "has_torch = u.find_spec('torch') is not None; "
            "has_torch and __import__('poptorch'); "
            "bad = [m for m in ('tensorflow', 'tf_keras', 'keras') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_only_the_tf_front_end_and_tests_import_tensorflow_in_source():
    heavy = ("tensorflow", "tf_keras", "keras", "horovod")
    wrong = []
    for package in PACKAGES:
        if package in TF_PACKAGES:
            continue
        for path in (REPO / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and node.module
                         and node.level == 0 else [])
                wrong += [f"{path.relative_to(REPO)}: {n}" for n in names
                          if n.split(".")[0] in heavy]
    assert not wrong, wrong


def test_the_served_names_table_names_ipupod_modules():
    """Every served name maps to an ipupod module that exists as a file (or None: an empty
    parent package), and the finder module imports only the standard library."""
    import ipupod_aliases

    for served, home in ipupod_aliases.SERVED.items():
        if home is None:
            continue
        path = REPO / home.replace(".", "/")
        assert (path / "__init__.py").exists() or path.with_suffix(".py").exists(), served
    tree = ast.parse((REPO / "ipupod_aliases.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
    assert imported <= {"importlib", "os", "sys", "types", "__future__"}, imported


def _public(module_name: str, name: str) -> bool:
    """Whether ``name`` is a public name of ``module_name`` (in its ``__all__``, or a public
    submodule of a package)."""
    import importlib
    module = importlib.import_module(module_name)
    if name in getattr(module, "__all__", ()):
        return True
    package = module_name.split(".")
    folders = [REPO.joinpath(*package), REPO.joinpath(package[0], ALIASES, *package[1:])]
    return any((f / f"{name}.py").exists() or (f / name / "__init__.py").exists()
               for f in folders) and not name.startswith("_")


def test_poptorch_uses_only_public_names_of_the_packages_below():
    lower = ("collectives", "ipu_node", "poprun")
    wrong = []
    for path in sorted((REPO / "poptorch").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}  # local name -> module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in lower:
                        if any(part.startswith("_") for part in a.name.split(".")):
                            wrong.append(f"{path.name}: import {a.name}")
                        aliases[a.asname or a.name.split(".")[0]] = \
                            a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                    node.module.split(".")[0] in lower:
                for a in node.names:
                    if any(p.startswith("_") for p in node.module.split(".")) or \
                            not _public(node.module, a.name):
                        wrong.append(f"{path.name}: from {node.module} import {a.name}")
                    elif _public(node.module, a.name) and a.name not in getattr(
                            __import__(node.module, fromlist=["_"]), "__all__", ()):
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id in aliases and not _public(aliases[node.value.id], node.attr):
                wrong.append(f"{path.name}: {aliases[node.value.id]}.{node.attr}")
    assert not wrong, f"poptorch uses private names of the packages below it: {wrong}"


# -- no import cycle inside a package (function-level imports included) --------------------

@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_inside_a_package(package):
    cycle = find_cycle(import_graph(package))
    assert cycle is None, f"import cycle in {package}: {' -> '.join(cycle)}"


#: the parts of collectives, each a subpackage (or the leaf types at the top): the part of a
#: module by its longest prefix
_PARTS = {"collectives._engine": "engine", "collectives.transports": "transports",
          "collectives.performance": "performance", "collectives.framework": "framework",
          "collectives.ipu": "framework", "collectives.ops": "api", "collectives": "api",
          "collectives.testing": "api"}

#: Public module paths of collectives -> the module whose public names they give: the paths
#: of the modules that moved into a part (the README's, and those poptorch, the examples,
#: the benchmarks and the tests import), and TF-IPU's module names. Each is a plain module
#: that re-exports its home's ``__all__``; no module of collectives imports one.
COLLECTIVES_PUBLIC_MODULES = {
    "collectives.strategies": "collectives.framework.strategies",
    "collectives.strategy_base": "collectives.framework.strategy_base",
    "collectives.distributed_variables": "collectives.framework.distributed_variables",
    "collectives.optimizers": "collectives.framework.optimizers",
    "collectives.horovod": "collectives.framework.horovod",
    "collectives.cost_model": "collectives.performance.cost_model",
    "collectives.step_model": "collectives.performance.step_model",
    "collectives.run_report": "collectives.performance.run_report",
    "collectives.report_cli": "collectives.performance.report_cli",
    "collectives.schedules": "collectives.performance.pricing",
    "collectives.link_flows": "collectives.performance.link_flows",
    "collectives.ipu_strategy": "collectives.framework.strategies",
    "collectives.ipu_multi_worker_strategy": "collectives.framework.strategies",
    "collectives.cross_replica_ops": "collectives",
    "collectives.all_to_all_op": "collectives",
    "collectives.reduce_scatter_op": "collectives",
    "collectives.replication_ops": "collectives",
    "collectives.ipu.horovod.ipu_horovod_strategy": "collectives.framework.strategies",
    "collectives.ipu.horovod.ipu_multi_replica_strategy": "collectives.framework.strategies",
    "collectives.ipu.horovod.popdist_strategy": "collectives.framework.strategies",
}
_LEAVES = ("errors", "options", "waiting", "records", "groups", "operators", "gcl_options")
#: what each part may import (besides itself): imports point down, and a transport reaches
#: the leaf types without the engine
_PART_IMPORTS = {
    "leaf": set(),
    "transports": {"leaf"},
    "performance": {"leaf"},
    "engine": {"leaf", "transports", "performance"},
    "framework": {"leaf", "transports", "performance", "engine", "api"},
    "api": {"leaf", "transports", "performance", "engine"},
}


def _part(module: str) -> str:
    if module.rpartition(".")[2] in _LEAVES and module.count(".") == 1:
        return "leaf"
    return next(part for prefix, part in sorted(_PARTS.items(), key=lambda p: -len(p[0]))
                if module == prefix or module.startswith(prefix + "."))


def test_the_parts_of_collectives_import_downwards():
    wrong = []
    for module, imported in import_graph("collectives").items():
        if module in COLLECTIVES_PUBLIC_MODULES:
            continue    # (a re-exporting module: for programs, checked below)
        here = _part(module)
        for other in imported:
            if other in COLLECTIVES_PUBLIC_MODULES:
                wrong.append(f"{module} imports the public path {other}")
                continue
            there = _part(other)
            if there != here and there not in _PART_IMPORTS[here]:
                wrong.append(f"{module} ({here}) imports {other} ({there})")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("public, home", sorted(COLLECTIVES_PUBLIC_MODULES.items()))
def test_a_public_module_path_of_collectives_gives_its_modules_names(public, home):
    """Every old path is a real module (a file: no import hooks) whose public names are its
    home's own objects; a path that moved gives all of them."""
    import importlib
    import importlib.util

    spec = importlib.util.find_spec(public)
    assert spec is not None and spec.origin and spec.origin.endswith(".py"), public
    module, code = importlib.import_module(public), importlib.import_module(home)
    assert module is not code
    if public.rpartition(".")[2] == home.rpartition(".")[2] or home.endswith(".pricing"):
        assert sorted(module.__all__) == sorted(code.__all__)
    shared = [n for n in module.__all__ if n in code.__all__]
    assert shared, f"{public} gives none of {home}'s names"
    missing = [n for n in shared if getattr(module, n, None) is not getattr(code, n)]
    assert not missing, missing
    assert all(hasattr(module, n) for n in module.__all__)


_IMPORT_LINE = re.compile(r"^\s*(?:from\s+(collectives(?:\.\w+)+)\s+import\b|"
                          r"import\s+(collectives(?:\.\w+)+))", re.M)


def test_the_collectives_paths_programs_import_are_pinned():
    """Every public module of collectives that poptorch, the examples, the benchmarks and the
    tests import (``import collectives.X``, ``from collectives.X import ...``) is a part's
    module or one of the pinned public paths above."""
    homes = set(COLLECTIVES_PUBLIC_MODULES.values())
    leaves = {f"collectives.{leaf}" for leaf in _LEAVES} | {
        "collectives.ops", "collectives.testing", "collectives.ipu", "collectives.ipu.horovod"}
    unpinned = set()
    for folder in ("poptorch", "popdist", "examples", "benchmarks", "tests"):
        for path in (REPO / folder).rglob("*.py"):
            for found in _IMPORT_LINE.findall(path.read_text()):
                name = found[0] or found[1]
                parts = name.split(".")
                if any(p.startswith("_") for p in parts) or name in leaves or \
                        name in COLLECTIVES_PUBLIC_MODULES or name in homes or \
                        parts[1] in ("framework", "performance", "transports"):
                    continue
                unpinned.add(f"{name} ({path.relative_to(REPO)})")
    assert not unpinned, sorted(unpinned)


#: the transports by backend: a folder each, holding the transport, its communicator, its
#: agreement and its requests (beside the interface, ``base``, and the registry)
TRANSPORT_FOLDERS = {
    "local": {"transport"},
    "mpi": {"transport", "communicator", "agreement", "index", "requests"},
    "grpc": {"transport", "communicator", "coordinator", "mailbox", "peer", "sender", "wire",
             "rings", "shm"},
}


def test_the_transports_are_a_folder_per_backend():
    folder = REPO / "collectives" / "transports"
    top = {p.stem for p in folder.glob("*.py")}
    assert top == {"__init__", "base", "registry"}, top
    for backend, modules in TRANSPORT_FOLDERS.items():
        found = {p.stem for p in (folder / backend).glob("*.py")} - {"__init__"}
        found |= {p.name for p in (folder / backend).iterdir()
                  if p.is_dir() and (p / "__init__.py").exists()}
        assert found == modules, (backend, found)
    assert {p.name for p in folder.iterdir() if p.is_dir() and p.name != "__pycache__"} == \
        set(TRANSPORT_FOLDERS)


@pytest.mark.parametrize("package, pinned", [
    ("collectives", lambda: {**COLLECTIVES_PUBLIC_MODULES, "collectives.horovod": 1,
                             "collectives.ipu": 1, "collectives.ipu.horovod": 1}),
    ("ipu_node", lambda: IPU_NODE_PUBLIC_MODULES)])
def test_the_aliases_of_a_package_are_in_one_folder(package, pinned):
    """Every module of the package's aliases folder is a pinned public path, every pinned
    path that only re-exports lives there, and no other module of the package is an alias
    (a module whose code is imports alone)."""
    folder = REPO / package / ALIASES
    names = set()
    for path in folder.rglob("*.py"):
        parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
        if parts:
            names.add(".".join([package, *parts]))
    assert names and names <= set(pinned()), sorted(names - set(pinned()))
    elsewhere = []
    for path in (REPO / package).rglob("*.py"):
        if ALIASES in path.parts or path.name == "__init__.py":
            continue
        body = [n for n in ast.parse(path.read_text()).body
                if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        if body and all(isinstance(n, (ast.Import, ast.ImportFrom)) or (
                isinstance(n, ast.Assign) and [t.id for t in n.targets
                                               if isinstance(t, ast.Name)] == ["__all__"])
                for n in body):
            elsewhere.append(str(path.relative_to(REPO)))
    assert not elsewhere, elsewhere


def test_horovod_lives_in_one_folder():
    horovod = {p.parent.relative_to(REPO) for p in (REPO / "collectives").rglob("*.py")
               if ALIASES not in p.parts and "horovod" in p.relative_to(REPO).parts}
    assert horovod == {REPO.joinpath("collectives", "framework", "horovod").relative_to(REPO)}


def test_no_import_hook_serves_collectives_paths():
    import collectives

    assert collectives is not None
    hooks = [f for f in sys.meta_path if type(f).__module__.startswith("collectives")]
    assert not hooks, hooks


def test_the_cycle_finder_finds_a_function_levelfind_cycle(tmp_path):
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": set()}
    assert find_cycle(graph) == ["p.a", "p.b", "p.c", "p.a"]
    assert find_cycle({"p.a": {"p.b"}, "p.b": set()}) is None


# -- ipu_node: its parts import downwards, its public module paths stay ------------------------

#: The parts of ipu_node and the parts each may import (the leaf modules at its root, errors,
#: env, transport_names, nest, import no other module of ipu_node and every part may import
#: them). The modules at the root that re-export a part's module (``ipu_node.loops``, ...) are
#: for programs: no part imports them.
IPU_NODE_PARTS = {
    "hardware": set(),
    "runtime": {"hardware"},
    "execution": {"runtime", "hardware"},
    "clock": {"runtime", "hardware"},
    "pipelining": {"execution", "clock", "runtime", "hardware"},
    "tools": {"runtime", "hardware"},
}
IPU_NODE_LEAVES = {"ipu_node.errors", "ipu_node.env", "ipu_node.transport_names", "ipu_node.nest"}

#: Public module paths of ipu_node -> the module whose public names they give: TF-IPU's module
#: names, the ones the README shows, and the modules ipu_node.__all__ names.
IPU_NODE_PUBLIC_MODULES = {
    "ipu_node.config": "ipu_node.runtime.config",
    "ipu_node.flags": "ipu_node.runtime.flags",
    "ipu_node.chips": "ipu_node.hardware.chips",
    "ipu_node.selection": "ipu_node.hardware.selection",
    "ipu_node.data": "ipu_node.execution.data",
    "ipu_node.loops": "ipu_node.execution.loops",
    "ipu_node.ipu_infeed_queue": "ipu_node.execution.ipu_infeed_queue",
    "ipu_node.ipu_outfeed_queue": "ipu_node.execution.ipu_outfeed_queue",
    "ipu_node.ipu_compiler": "ipu_node.execution.ipu_compiler",
    "ipu_node.scopes": "ipu_node.execution.scopes",
    "ipu_node.optimizers": "ipu_node.execution.optimizers",
    "ipu_node.rand_ops": "ipu_node.execution.rand_ops",
    "ipu_node.utils": "ipu_node.execution.utils",
    "ipu_node.pipelining_ops": "ipu_node.pipelining.pipelining_ops",
    "ipu_node.clock": "ipu_node.clock._timelines",
}


def _ipu_node_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in IPU_NODE_PARTS else None


def test_the_parts_of_ipu_node_import_downwards():
    graph = import_graph("ipu_node")
    wrong = []
    for module, imported in graph.items():
        for target in imported:
            here, there = _ipu_node_part(module), _ipu_node_part(target)
            if module in IPU_NODE_LEAVES:
                ok = target in IPU_NODE_LEAVES
            elif here is None:          # ipu_node/__init__ and the re-exporting modules
                ok = True
            elif there is None:         # the root: leaves only, never a re-exporting module
                ok = target in IPU_NODE_LEAVES
            else:
                ok = there == here or there in IPU_NODE_PARTS[here]
            if not ok:
                wrong.append(f"{module} -> {target}")
    assert not wrong, wrong


@pytest.mark.parametrize("public, home", sorted(IPU_NODE_PUBLIC_MODULES.items()))
def test_a_public_module_path_of_ipu_node_gives_its_modules_names(public, home):
    import importlib

    import ipu_node

    module, code = importlib.import_module(public), importlib.import_module(home)
    assert sorted(module.__all__) == sorted(code.__all__)
    missing = [n for n in code.__all__ if getattr(module, n, None) is not getattr(code, n)]
    assert not missing, missing
    name = public.rpartition(".")[2]
    if name in ipu_node.__all__:
        assert getattr(ipu_node, name) is module


def test_every_module_ipu_node_all_names_has_a_public_path():
    import types

    import ipu_node

    modules = {f"ipu_node.{n}" for n in ipu_node.__all__
               if isinstance(getattr(ipu_node, n), types.ModuleType)}
    assert modules <= set(IPU_NODE_PUBLIC_MODULES), modules - set(IPU_NODE_PUBLIC_MODULES)
