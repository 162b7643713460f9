"""The package layout of DESIGN.md: imports point down, no heavy imports at import time."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("popdist", "poprun", "launch", "collectives", "ipu_node", "protos")
# DESIGN.md: poprun -> launch -> protos, poprun -> ipu_node, collectives -> ipu_node,
# collectives -> protos, launch -> protos; popdist (Graphcore's name for the PopDist API) is a
# thin layer over poprun.popdist, and nothing of ipupod imports it.
ALLOWED = {
    "popdist": {"poprun"},
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


def test_importing_the_packages_loads_neither_mpi_nor_grpc():
    code = ("import sys, collectives, collectives.strategies, ipu_node, poprun, launch, popdist,"
            " popdist.tensorflow;"
            "bad = [m for m in ('mpi4py', 'mpi4py.MPI', 'grpc') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
