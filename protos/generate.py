"""Regenerate the Python modules of the ``.proto`` files (needs grpcio-tools, a dev tool).

    python -m protos.generate            # rewrite protos/*_pb2.py, *_pb2_grpc.py in place

Protos are compiled with the repository root as include path, so the generated
``*_pb2_grpc.py`` import ``from protos import xxx_pb2`` and work as ``protos.xxx_pb2``.
"""

from __future__ import annotations

import os
import subprocess
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
        RuntimeError: protoc failed (its exit code and output).

    protoc runs in a process of its own (``python -m grpc_tools.protoc``): in a process that
    has loaded another protobuf runtime (TensorFlow's, as a test session may have) the
    in-process compiler crashed with a segmentation fault.
    """
    import grpc_tools

    out_root = Path(out_root)
    (out_root / "protos").mkdir(parents=True, exist_ok=True)
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    args = [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT}", f"-I{include}",
            f"--python_out={out_root}", f"--grpc_python_out={out_root}",
            *(str(PROTOS_DIR / name) for name in PROTO_FILES)]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"protoc failed with exit code {done.returncode}: "
                           f"{' '.join(args[1:])}\n{done.stderr}")
    return [out_root / "protos" / f"{Path(name).stem}{suffix}"
            for name in PROTO_FILES for suffix in ("_pb2.py", "_pb2_grpc.py")]


if __name__ == "__main__":
    for path in generate():
        print(path)
    sys.exit(0)
