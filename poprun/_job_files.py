"""The files between a test job's parent and its instances: the job's description, each
instance's outcome, and values that cross, in a private directory of the job (0700, files
0600), never pickled.

A value is written as JSON, with numpy arrays beside it as ``.npy`` files
(``numpy.save(..., allow_pickle=False)``: an object array is refused) and referenced from
the JSON as ``{"__ndarray__": "<file>"}``; a tuple is ``{"__tuple__": [...]}``. What else JSON
holds (dict with str keys, list, str, int, float, bool, None) crosses as it is. A numpy
scalar crosses as a 0-d array and comes back as a numpy scalar of the same dtype.
"""

from __future__ import annotations

import json
import os
from typing import Any

from launch.errorfile import write_json_atomically

__all__ = ["write_json", "read_json", "encode_value", "decode_value", "spec_path",
           "outcome_path", "ValueFormatError"]

_ARRAY, _TUPLE = "__ndarray__", "__tuple__"


class ValueFormatError(TypeError):
    """A value cannot cross between the parent and an instance (not JSON, nor a numpy
    array); names where it sits in the value."""


def spec_path(jobdir: str) -> str:
    """The job's description, written by the parent."""
    return os.path.join(jobdir, "spec.json")


def outcome_path(jobdir: str, index: int) -> str:
    """Instance ``index``'s outcome, written by the instance."""
    return os.path.join(jobdir, f"outcome.{index}.json")


def write_json(path: str, record: dict) -> None:
    """Write ``record`` at ``path`` atomically (temp file, mode 0600, then rename)."""
    write_json_atomically(path, record)


def read_json(path: str) -> dict | None:
    """The record at ``path``, or None when there is none (or it is unreadable)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _is_numpy(value: Any) -> bool:
    return type(value).__module__ == "numpy"   # numpy itself is imported only when needed


def encode_value(value: Any, directory: str, stem: str, where: str = "value") -> Any:
    """``value`` as JSON, its numpy arrays saved in ``directory`` as ``<stem>.<k>.npy``.

    Raises:
        ValueFormatError: a part of ``value`` is neither JSON nor a numpy array (an object
            array, a set, a class instance...), naming where it is (``value[1]['w']``).
    """
    counter = [0]

    def enc(v: Any, at: str) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)) and not _is_numpy(v):
            return v
        if _is_numpy(v):
            import numpy as np
            array = np.asarray(v)
            if array.dtype.hasobject:
                raise ValueFormatError(f"{at}: a numpy array of Python objects cannot cross "
                                       "without pickling; use a numeric or string dtype")
            name = f"{stem}.{counter[0]}.npy"
            counter[0] += 1
            np.save(os.path.join(directory, name), array, allow_pickle=False)
            return {_ARRAY: name}
        if isinstance(v, tuple):
            return {_TUPLE: [enc(x, f"{at}[{i}]") for i, x in enumerate(v)]}
        if isinstance(v, list):
            return [enc(x, f"{at}[{i}]") for i, x in enumerate(v)]
        if isinstance(v, dict):
            bad = [k for k in v if not isinstance(k, str) or k in (_ARRAY, _TUPLE)]
            if bad:
                raise ValueFormatError(f"{at}: dict keys must be strings other than "
                                       f"{_ARRAY!r} and {_TUPLE!r}, got {bad[0]!r}")
            return {k: enc(x, f"{at}[{k!r}]") for k, x in v.items()}
        raise ValueFormatError(f"{at}: a {type(v).__name__} cannot cross between the test and "
                               "the instances (only JSON values and numpy arrays do; nothing "
                               "is pickled)")

    return enc(value, where)


def decode_value(data: Any, directory: str) -> Any:
    """The value :func:`encode_value` wrote (arrays read with ``allow_pickle=False``)."""
    if isinstance(data, list):
        return [decode_value(x, directory) for x in data]
    if isinstance(data, dict):
        if set(data) == {_ARRAY}:
            import numpy as np
            name = os.path.basename(data[_ARRAY])  # never outside the job's directory
            array = np.load(os.path.join(directory, name), allow_pickle=False)
            return array[()] if array.ndim == 0 else array
        if set(data) == {_TUPLE}:
            return tuple(decode_value(x, directory) for x in data[_TUPLE])
        return {k: decode_value(x, directory) for k, x in data.items()}
    return data
