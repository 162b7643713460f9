"""Regenerate the Python modules of the ``.proto`` files (needs grpcio-tools, a dev tool).

    python -m protos.generate            # rewrite protos/*_pb2.py, *_pb2_grpc.py in place

Protos are compiled with the repository root as include path, so the generated
``*_pb2_grpc.py`` import ``from protos import xxx_pb2`` and work as ``protos.xxx_pb2``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PROTOS_DIR = Path(__file__).resolve().parent
ROOT = PROTOS_DIR.parent
PROTO_FILES = ("coordinator.proto", "peer.proto")


def generate(out_root: str | os.PathLike = ROOT) -> list[Path]:
    """Compile every proto of :data:`PROTO_FILES` into ``out_root/protos/``.

    Returns:
        The paths written.

    Raises:
        ImportError: grpcio-tools is not installed (``pip install grpcio-tools``).
        RuntimeError: protoc failed (its exit code).
    """
    from grpc_tools import protoc
    import grpc_tools

    out_root = Path(out_root)
    (out_root / "protos").mkdir(parents=True, exist_ok=True)
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    args = ["grpc_tools.protoc", f"-I{ROOT}", f"-I{include}",
            f"--python_out={out_root}", f"--grpc_python_out={out_root}",
            *(str(PROTOS_DIR / name) for name in PROTO_FILES)]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}: {' '.join(args)}")
    return [out_root / "protos" / f"{Path(name).stem}{suffix}"
            for name in PROTO_FILES for suffix in ("_pb2.py", "_pb2_grpc.py")]


if __name__ == "__main__":
    for path in generate():
        print(path)
    sys.exit(0)
