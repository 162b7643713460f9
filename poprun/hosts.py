"""Host lists as Graphcore's poprun takes them, and which hosts are this machine.

``--host`` / ``-H``: ``host0,host1`` or ``host[0-2,4]`` (Graphcore's example), with
zero-padded ranges kept (``node[01-03]`` is ``node01,node02,node03``) and Open MPI's slot
suffix ``host:N`` accepted (the slots are ignored: poprun divides the instances evenly among
the hosts). ``--hostfile``: one host a line, ``#`` comments and blank lines skipped.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from typing import Iterable

__all__ = ["HostError", "expand_hosts", "read_hostfile", "is_this_machine"]

_BRACKET = re.compile(r"^(.*?)\[([^\]]*)\](.*)$")


class HostError(ValueError):
    """A host list that cannot be read (names the part that is wrong)."""


def _expand_one(pattern: str) -> list[str]:
    match = _BRACKET.match(pattern)
    if not match:
        if "[" in pattern or "]" in pattern:
            raise HostError(f"host {pattern!r}: unbalanced brackets")
        return [pattern]
    head, body, tail = match.groups()
    names = []
    for part in body.split(","):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise HostError(f"host {pattern!r}: {part!r} is not a number or a range a-b")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first or last - first > 100_000:
            raise HostError(f"host {pattern!r}: bad range {part!r}")
        width = len(lo) if lo.startswith("0") else 0
        names += [f"{head}{n:0{width}d}" for n in range(first, last + 1)]
    return [name for n in names for name in _expand_one(n + tail)]


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return parts


def expand_hosts(spec: str | Iterable[str]) -> list[str]:
    """The hosts of a ``--host`` value, in order.

    Raises:
        HostError: an empty name, bad brackets or ranges, or a bad ``:N`` slot suffix.
    """
    items = _split_top(spec) if isinstance(spec, str) else list(spec)
    hosts = []
    for item in items:
        item = item.strip()
        name, colon, slots = item.rpartition(":") if re.search(r":\d*$", item) else (item, "", "")
        if colon and not slots.isdigit():
            raise HostError(f"host {item!r}: the slots after ':' must be a number")
        if not name:
            raise HostError(f"empty host name in {spec!r}")
        hosts += _expand_one(name)
    return hosts


def read_hostfile(path: str) -> list[str]:
    """The hosts of a ``--hostfile``: one a line.

    Raises:
        HostError: the file cannot be read or has no hosts.
    """
    try:
        with open(path) as f:
            lines = [line.split("#")[0].strip() for line in f]
    except OSError as exc:
        raise HostError(f"--hostfile {path}: {exc.strerror}") from None
    hosts = expand_hosts([line.split()[0] for line in lines if line])
    if not hosts:
        raise HostError(f"--hostfile {path}: no hosts in it")
    return hosts


def _local_addresses() -> set[str]:
    names = {"localhost", socket.gethostname(), socket.getfqdn()}
    addresses = set()
    for name in names:
        try:
            addresses |= {info[4][0] for info in socket.getaddrinfo(name, None)}
        except OSError:
            pass
    return names | addresses | _interface_addresses()


def _interface_addresses() -> set[str]:
    """Addresses of this machine's interfaces (Linux ``/proc/net``; empty elsewhere)."""
    found = set()
    try:
        with open("/proc/net/fib_trie") as f:
            lines = f.read().splitlines()
    except OSError:
        return found
    for prev, line in zip(lines, lines[1:]):
        if "/32 host LOCAL" in line:
            found.add(prev.split()[-1])
    return found


def is_this_machine(host: str, local: set[str] | None = None) -> bool:
    """Whether ``host`` names this machine: ``localhost``, a loopback address, its host
    name, or an address of one of its interfaces (of this network namespace)."""
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        pass
    return host in (local if local is not None else _local_addresses())
