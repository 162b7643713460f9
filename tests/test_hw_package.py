"""Package rules of ipu_node: no imports of other ipupod packages, no import-time side effects."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import pytest

import ipu_node

OTHER_PACKAGES = {"poprun", "launch", "collectives", "protos"}


def test_ipu_node_imports_no_other_ipupod_package():
    root = pathlib.Path(ipu_node.__file__).parent
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] not in OTHER_PACKAGES, (path, name)


@pytest.mark.slow
def test_import_has_no_side_effects(tmp_path):
    occupancy = tmp_path / "occ"
    env = dict(os.environ, IPUPOD_OCCUPANCY_DIR=str(occupancy), IPUPOD_SYSTEM="no-such-system")
    code = "import ipu_node, ipu_node.tools.gc_info, ipu_node.tools.gc_monitor"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=30)
    assert not occupancy.exists()          # and the bad IPUPOD_SYSTEM was not read


@pytest.mark.slow
def test_gc_info_runs_as_a_program():
    out = subprocess.run([sys.executable, "-m", "ipu_node.tools.gc_info", "-l", "--system",
                          "C2-16"], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.splitlines()[-1] == "|--- PCIe Id:  [8], DNC Id: [15], PCI Domain: [0000:8b:00.0]"
