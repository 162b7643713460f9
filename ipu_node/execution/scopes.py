"""Placement scopes: ``ipu_scope(device)`` and ``ipu_shard(index)`` [004:74-98].

Eager ipupod computes every value where it is written, so these scopes change no numbers;
they record where TF-IPU would place the operations:

* ``ipu_scope('/device:IPU:0')`` marks code as placed on an IPU device. ``ipu_compiler.compile``
  requires it (or a strategy's scope), as TF-IPU does [004:39-41].
* ``ipu_shard(i)`` places what is made inside on shard ``i`` of the replica, i.e. on the
  replica's ``i``-th IPU (``ReplicaContext.ipus[i]``). Other parts of the runtime read it with
  :func:`current_shard` (Variables use it for their SRAM placement). Inside a replica function
  the index must be below the replica's IPU count (``ipus_per_replica``).

Scopes are per thread; ``compile`` carries the caller's scopes into the replica threads.
"""

from __future__ import annotations

import contextlib
import re
import threading
from typing import Iterator

import numpy as np

from ipu_node.runtime.device import IPU
from ipu_node.runtime.replica import current_replica_context

__all__ = ["ipu_scope", "ipu_shard", "current_ipu_scope", "current_shard", "current_ipu",
           "device_ordinal", "placement", "restored_placement"]

_local = threading.local()
_DEVICE = re.compile(r"(?:^|/)device:IPU:(\d+)$", re.IGNORECASE)


def device_ordinal(device: str) -> int:
    """The ordinal N of a TF IPU device name (``'/device:IPU:N'``, with or without a
    ``/job:.../task:N`` prefix).

    Raises:
        ValueError: not an IPU device name (names the string).
    """
    match = _DEVICE.search(device) if isinstance(device, str) else None
    if match is None:
        raise ValueError(f"{device!r} is not an IPU device name; use '/device:IPU:0'")
    return int(match.group(1))


def _stack(name: str) -> list:
    stack = getattr(_local, name, None)
    if stack is None:
        stack = []
        setattr(_local, name, stack)
    return stack


@contextlib.contextmanager
def ipu_scope(device: str) -> Iterator[None]:
    """Place the enclosed code on the IPU device ``device`` (e.g. ``'/device:IPU:0'``).

    Raises:
        ValueError: ``device`` is not an IPU device name.
    """
    device_ordinal(device)
    stack = _stack("devices")
    stack.append(device)
    try:
        yield
    finally:
        stack.pop()


def current_ipu_scope() -> str | None:
    """The device of the innermost ``ipu_scope`` in this thread, or None."""
    stack = _stack("devices")
    return stack[-1] if stack else None


@contextlib.contextmanager
def ipu_shard(index: int) -> Iterator[None]:
    """Place the enclosed code on shard ``index`` (the replica's ``index``-th IPU).

    Raises:
        TypeError: ``index`` is not an integer.
        ValueError: ``index`` < 0, or, inside a replica function, ``index`` >= the replica's
            IPU count (``ipus_per_replica``).
    """
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
        raise TypeError(f"ipu_shard index must be an integer, got {index!r}")
    if index < 0:
        raise ValueError(f"ipu_shard index must be >= 0, got {index}")
    ctx = current_replica_context()
    if ctx is not None and ctx.ipus and index >= len(ctx.ipus):
        raise ValueError(
            f"ipu_shard({index}): replica {ctx.replica_index} has {len(ctx.ipus)} IPU(s) "
            f"(ipus_per_replica={len(ctx.ipus)}), so shards are 0..{len(ctx.ipus) - 1}")
    stack = _stack("shards")
    stack.append(int(index))
    try:
        yield
    finally:
        stack.pop()


def current_shard() -> int | None:
    """The index of the innermost ``ipu_shard`` in this thread, or None outside one (code
    outside every shard scope goes on shard 0)."""
    stack = _stack("shards")
    return stack[-1] if stack else None


def current_ipu() -> IPU | None:
    """The IPU the current shard maps to in the running replica (shard 0 outside
    ``ipu_shard``); None outside replica functions or when the replica has no IPUs."""
    ctx = current_replica_context()
    if ctx is None or not ctx.ipus:
        return None
    return ctx.ipus[current_shard() or 0]


def placement() -> tuple[tuple, tuple]:
    """This thread's scopes (devices, shards), to re-enter in another thread."""
    return tuple(_stack("devices")), tuple(_stack("shards"))


@contextlib.contextmanager
def restored_placement(saved: tuple[tuple, tuple]) -> Iterator[None]:
    """Run a block with the scopes of :func:`placement` (in a replica thread)."""
    devices, shards = _stack("devices"), _stack("shards")
    n_dev, n_shard = len(devices), len(shards)
    devices.extend(saved[0])
    shards.extend(saved[1])
    try:
        yield
    finally:
        del devices[n_dev:]
        del shards[n_shard:]
