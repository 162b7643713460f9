"""``broadcast_object`` and ``allgather_object`` without pickle.

Horovod serialises these objects with cloudpickle; ipupod sends nothing pickled over the
network (DESIGN.md, security), because unpickling bytes from a peer runs the peer's code.
Objects are encoded as JSON text instead, with tags for the types JSON lacks. Supported:
None, bool, int, float (nan/inf included), str, bytes, list, tuple, dict (any keys of
these types, kept as key/value pairs), numpy arrays of bool/int/uint/float/complex dtypes
and numpy scalars of them, and torch tensors (``optimizer.state_dict()``; any dtype numpy
has, and bfloat16; they arrive on the CPU, ``requires_grad`` kept; decoding one imports
torch if the receiving program has not). Anything else raises TypeError on the sending
rank, naming the type, before any data moves (every rank then gets the error of the
agreement).
"""

from __future__ import annotations

import base64
import importlib
import json
import sys

import numpy as np

from collectives.framework.horovod._tensors import is_torch, to_array

_ARRAY_KINDS = "biufc"


def _encode(obj, path: str):
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int) and not isinstance(obj, np.integer):
        return obj
    if isinstance(obj, float):
        return {"$f": repr(obj)}
    if isinstance(obj, bytes):
        return {"$b": base64.b64encode(obj).decode()}
    if is_torch(obj):
        arr, like = to_array(obj)
        return {"$pt": str(obj.dtype).removeprefix("torch."), "bits": like.bits is not None,
                "grad": bool(obj.requires_grad), "data": _encode(arr, path)}
    if isinstance(obj, (np.ndarray, np.generic)):
        arr = np.asarray(obj)
        if arr.dtype.kind not in _ARRAY_KINDS:
            raise TypeError(f"{path}: numpy dtype {arr.dtype} cannot be sent (numeric and "
                            "bool dtypes only)")
        return {"$nd": arr.dtype.str, "shape": list(arr.shape), "scalar": arr.ndim == 0
                and isinstance(obj, np.generic),
                "data": base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode()}
    if isinstance(obj, list):
        return [_encode(v, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {"$t": [_encode(v, f"{path}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, dict):
        return {"$d": [[_encode(k, f"{path} key"), _encode(v, f"{path}[{k!r}]")]
                       for k, v in obj.items()]}
    raise TypeError(f"{path}: objects of type {type(obj).__name__} cannot be sent; ipupod "
                    "sends None, bool, int, float, str, bytes, list, tuple, dict and numpy "
                    "arrays (no pickle over the network)")


def _decode(obj):
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "$f" in obj:
        return float(obj["$f"])
    if "$b" in obj:
        return base64.b64decode(obj["$b"])
    if "$t" in obj:
        return tuple(_decode(v) for v in obj["$t"])
    if "$d" in obj:
        return {_decode(k): _decode(v) for k, v in obj["$d"]}
    if "$pt" in obj:
        return _tensor(obj)
    if "$nd" in obj:
        dtype = np.dtype(obj["$nd"])
        if dtype.kind not in _ARRAY_KINDS:
            raise ValueError(f"received an array of dtype {dtype}: not allowed")
        arr = np.frombuffer(base64.b64decode(obj["data"]), dtype).reshape(obj["shape"]).copy()
        return arr[()] if obj["scalar"] else arr
    raise ValueError(f"received an object with unknown tags {sorted(obj)}")


def _tensor(obj: dict):
    """A received torch tensor (torch imported here if the program has not)."""
    torch = sys.modules.get("torch") or importlib.import_module("torch")
    dtype = getattr(torch, str(obj["$pt"]), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"received a tensor of unknown dtype {obj['$pt']!r}")
    arr = np.array(_decode(obj["data"]))
    t = torch.from_numpy(arr)
    t = t.view(dtype) if obj.get("bits") else t.to(dtype)
    return t.requires_grad_() if obj.get("grad") else t


def encode(obj) -> bytes:
    """``obj`` as UTF-8 JSON bytes (module docstring: the types allowed).

    Raises:
        TypeError: a value of another type (names it and where it is).
    """
    return json.dumps(_encode(obj, "object"), separators=(",", ":")).encode()


def decode(data: bytes):
    """The object :func:`encode` made.

    Raises:
        ValueError: the bytes are not such an encoding.
    """
    return _decode(json.loads(data.decode()))
