"""ipupod's PEP 517 backend (``_backend/ipupod_build.py``): the wheel and the editable wheel
carry ``ipupod_aliases.pth`` (which serves TF-IPU's module names), listed in RECORD."""

import base64
import hashlib
import importlib.util
import zipfile

from tests.import_graph import REPO


def _backend():
    spec = importlib.util.spec_from_file_location("ipupod_build",
                                                  REPO / "_backend" / "ipupod_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pth_file_joins_the_wheel_and_its_record(tmp_path):
    backend = _backend()
    wheel = tmp_path / "x-1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("x/__init__.py", "")
        z.writestr("x-1.dist-info/RECORD", "x/__init__.py,,\nx-1.dist-info/RECORD,,\n")
    backend._add_pth(str(wheel))
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        pth = z.read(backend.PTH_NAME)
        record = z.read("x-1.dist-info/RECORD").decode().splitlines()
    assert "x/__init__.py" in names and pth == backend.PTH_TEXT
    digest = base64.urlsafe_b64encode(hashlib.sha256(pth).digest()).rstrip(b"=").decode()
    assert f"{backend.PTH_NAME},sha256={digest},{len(pth)}" in record
    assert pth.startswith(b"import ipupod_aliases; ipupod_aliases.install()")


def test_pyproject_builds_with_the_backend():
    text = (REPO / "pyproject.toml").read_text()
    assert 'build-backend = "ipupod_build"' in text and 'backend-path = ["_backend"]' in text
