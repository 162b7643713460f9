"""ipupod's PEP 517 build backend: setuptools' own (``setuptools.build_meta``), and one file
more in the wheel and in the editable wheel: ``ipupod_aliases.pth``, which runs
``ipupod_aliases.install()`` at interpreter start-up so that TF-IPU's module names
(``tensorflow.python.ipu``, ...) resolve to ipupod's modules (see ``ipupod_aliases.py``).
``pip install -e`` installs no ``.pth`` file of a project's own otherwise.

The file is added to the built wheel's archive and to its ``RECORD`` (path, sha256, size),
so pip installs it beside the packages and removes it on uninstall.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import tempfile
import zipfile

from setuptools import build_meta as _meta
from setuptools.build_meta import *  # noqa: F401,F403 (every hook setuptools offers)

PTH_NAME = "ipupod_aliases.pth"
PTH_TEXT = b"import ipupod_aliases; ipupod_aliases.install()\n"


def _add_pth(wheel_path: str) -> None:
    """Rewrite ``wheel_path`` with :data:`PTH_NAME` at the top of the archive."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(PTH_TEXT).digest()).rstrip(b"=").decode()
    fd, tmp = tempfile.mkstemp(suffix=".whl", dir=os.path.dirname(wheel_path))
    os.close(fd)
    with zipfile.ZipFile(wheel_path) as src, \
            zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                data = data.rstrip(b"\n") + \
                    f"\n{PTH_NAME},sha256={digest},{len(PTH_TEXT)}\n".encode()
                dst.writestr(PTH_NAME, PTH_TEXT)
            dst.writestr(info, data)
    shutil.move(tmp, wheel_path)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = _meta.build_wheel(wheel_directory, config_settings, metadata_directory)
    _add_pth(os.path.join(wheel_directory, name))
    return name


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name = _meta.build_editable(wheel_directory, config_settings, metadata_directory)
    _add_pth(os.path.join(wheel_directory, name))
    return name
