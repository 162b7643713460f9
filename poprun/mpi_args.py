"""``--mpi-global-args``, ``--mpi-local-args``, ``--instance-mpi-local-args``: the Open MPI
flags real poprun command lines pass, translated for MPICH's mpirun (Hydra).

Graphcore's poprun runs Open MPI's mpirun; ipupod runs MPICH's. Each flag is either
translated, or has no effect here and says so in one line (logged with ``-v``), or is refused
before anything starts, naming it:

=============================================  ============================================
Open MPI                                        ipupod / MPICH Hydra
=============================================  ============================================
``--tag-output``                                no effect: poprun always tags output
``--allow-run-as-root``                         no effect: Hydra never refuses root
``--oversubscribe``                             no effect: Hydra never refuses it
``--bind-to X`` (none, core, socket, numa...)   ``-bind-to X`` (job-wide in Hydra)
``--map-by X`` (core, socket, numa...)          ``-map-by X``; ``slot``/``node``/``ppr``:
                                                no effect (poprun places instances itself)
``--mca btl_tcp_if_include IF``,                ``-iface IF`` (the interface Hydra and
``--mca oob_tcp_if_include IF``                 MPICH use); a subnet (``10.0.0.0/8``): no
                                                effect
``--mca plm_rsh_agent CMD``                     ``-launcher-exec CMD``
``--mca btl|pml|coll ...``                      no effect: Open MPI components
``-x NAME=value``                               the variable, in the instances' environment
``-x NAME``                                     passed already (Hydra passes poprun's whole
                                                environment)
``--output-filename DIR``                       no effect: output is on poprun's stdout
``--report-bindings``                           no effect
=============================================  ============================================

MPICH's own spellings are taken as they are: ``-iface IF``, ``-launcher NAME``,
``-launcher-exec PATH``, ``-genv NAME VALUE``/``-env NAME VALUE``, ``-bind-to X``,
``-map-by X``. Counts and hosts (``-np``, ``-H``, ``--hostfile``) are refused: poprun's
``--num-instances`` and ``--host`` give them. A value with a secret in it belongs in the
environment, not here: these words are on poprun's command line already.
"""

from __future__ import annotations

import re
import shlex
import socket
from dataclasses import dataclass, field

__all__ = ["MpiArgs", "translate_mpi_args", "parse_instance_args", "check_interface",
           "local_interfaces"]

_BIND = ("none", "hwthread", "core", "l1cache", "l2cache", "l3cache", "socket", "numa",
         "board", "package")
_MAP = ("hwthread", "core", "l1cache", "l2cache", "l3cache", "socket", "numa", "board",
        "package")
_NO_EFFECT = {
    "tag-output": "poprun always tags instance output ([1,i]<stdout>:)",
    "allow-run-as-root": "MPICH's mpirun runs as root without it",
    "oversubscribe": "MPICH's mpirun never refuses more instances than cores",
    "report-bindings": "MPICH's mpirun has no such report",
    "display-map": "poprun --print-topology shows where instances run",
}
_NO_EFFECT_MCA = ("btl", "pml", "coll", "osc", "mtl", "btl_openib_allow_ib",
                  "btl_openib_want_cuda_gdr", "orte_base_help_aggregate")
_REFUSED = {
    "np": "poprun starts --num-instances instances", "n": "poprun starts --num-instances "
    "instances", "c": "poprun starts --num-instances instances",
    "H": "use poprun's --host", "host": "use poprun's --host", "hosts": "use poprun's --host",
    "hostfile": "use poprun's --hostfile", "machinefile": "use poprun's --hostfile",
}


#: a backslash at the end of a line, as a launch script continues a quoted value
_CONTINUATION = re.compile(r"\\\r?\n")


class MpiArgsError(ValueError):
    """A flag of ``--mpi-*-args`` that ipupod cannot pass on (names it and the option)."""


@dataclass(frozen=True)
class MpiArgs:
    """What a ``--mpi-*-args`` value becomes.

    Attributes:
        mpirun_args: global options for Hydra's mpiexec, e.g. ``("-iface", "eth0")``.
        env: ``(NAME, value)`` pairs for the instances' environment.
        notes: one line per flag that has no effect (or is passed already).
    """

    mpirun_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = field(default=())


def _split(text: str, where: str) -> list[str]:
    """The words of ``text`` as a shell splits them; a backslash-newline (a launch script's
    line continuation kept inside a quoted value) is whitespace."""
    text = _CONTINUATION.sub(" ", text)
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise MpiArgsError(f"{where}: {exc} in {text!r}") from None


class _Words:
    def __init__(self, words: list[str], where: str):
        self.words, self.where, self.i = words, where, 0

    def value(self, flag: str, inline: str | None) -> str:
        if inline is not None:
            return inline
        if self.i >= len(self.words):
            raise MpiArgsError(f"{self.where}: {flag} needs a value")
        self.i += 1
        return self.words[self.i - 1]


def translate_mpi_args(text: str, *, where: str = "--mpi-global-args") -> MpiArgs:
    """Translate one ``--mpi-*-args`` value (a shell-quoted string of Open MPI flags).

    Raises:
        MpiArgsError: unbalanced quotes, a flag ipupod does not know, a flag without its
            value, a bad ``--bind-to``/``--map-by`` value, or a count/host flag (names it).
    """
    words = _Words(_split(text, where), where)
    mpirun: list[str] = []
    env: list[tuple[str, str]] = []
    notes: list[str] = []
    while words.i < len(words.words):
        flag = words.words[words.i]
        words.i += 1
        if not flag.startswith("-") or flag == "-":
            raise MpiArgsError(f"{where}: unexpected word {flag!r} (not an mpirun option)")
        key, eq, inline = flag.lstrip("-").partition("=")
        inline = inline if eq else None
        if key in _NO_EFFECT:
            notes.append(f"{where} {flag}: no effect in ipupod: {_NO_EFFECT[key]}")
        elif key in _REFUSED:
            raise MpiArgsError(f"{where}: {flag} is not allowed there: {_REFUSED[key]}")
        elif key == "x":
            name, has_value, value = words.value(flag, inline).partition("=")
            if has_value:
                env.append((name, value))
            else:
                notes.append(f"{where} -x {name}: passed already (mpirun passes poprun's "
                             "environment to every instance)")
        elif key in ("genv", "env"):
            name = words.value(flag, inline)
            env.append((name, words.value(flag, None)))
        elif key in ("bind-to", "map-by"):
            mpirun += _binding(key, words.value(flag, inline), where, notes)
        elif key == "mca":
            mpirun += _mca(words.value(flag, inline), words.value(flag, None), where, notes)
        elif key in ("iface", "launcher", "launcher-exec"):
            mpirun += [f"-{key}", words.value(flag, inline)]
        elif key == "output-filename":
            notes.append(f"{where} {flag} {words.value(flag, inline)}: no effect in ipupod: "
                         "instance output goes to poprun's stdout/stderr, tagged")
        else:
            raise MpiArgsError(
                f"{where}: unknown mpirun option {flag!r}; ipupod passes on --tag-output, "
                "--allow-run-as-root, --bind-to, --map-by, --mca btl_tcp_if_include/"
                "oob_tcp_if_include, -x NAME[=value], --output-filename, --report-bindings "
                "and MPICH's -iface, -launcher, -launcher-exec, -genv, -env")
    return MpiArgs(tuple(mpirun), tuple(env), tuple(notes))


def _binding(key: str, value: str, where: str, notes: list[str]) -> list[str]:
    base, _, modifiers = value.lower().partition(":")
    known = _BIND if key == "bind-to" else _MAP
    if key == "map-by" and base in ("slot", "node", "ppr", "dist", "seq", "rankfile"):
        notes.append(f"{where} --map-by {value}: no effect in ipupod: poprun places the "
                     "instances on the hosts itself")
        return []
    if base not in known:
        raise MpiArgsError(f"{where}: --{key} {value!r}: unknown; known: {', '.join(known)}")
    if modifiers:
        notes.append(f"{where} --{key} {value}: the modifiers {modifiers!r} have no effect "
                     f"in MPICH; using -{key} {base}")
    return [f"-{key}", base]


def _mca(param: str, value: str, where: str, notes: list[str]) -> list[str]:
    if param in ("btl_tcp_if_include", "oob_tcp_if_include"):
        iface = value.split(",")[0]
        if "/" in iface:
            notes.append(f"{where} --mca {param} {value}: no effect in ipupod: MPICH's -iface "
                         "takes an interface name, not a subnet")
            return []
        return ["-iface", iface]
    if param == "plm_rsh_agent":
        return ["-launcher-exec", value]
    if param in _NO_EFFECT_MCA:
        notes.append(f"{where} --mca {param} {value}: no effect in ipupod: it selects Open "
                     "MPI components, which MPICH does not have")
        return []
    raise MpiArgsError(f"{where}: --mca {param} is not known to ipupod (known: "
                       "btl_tcp_if_include, oob_tcp_if_include, plm_rsh_agent, and "
                       f"{', '.join(_NO_EFFECT_MCA)} with no effect)")


def parse_instance_args(text: str) -> tuple[int, str]:
    """``--instance-mpi-local-args I:ARGS`` as ``(I, ARGS)``; ``ARGS`` may be quoted.

    Raises:
        MpiArgsError: no ``I:`` prefix, or ``I`` not an index >= 0.
    """
    index, colon, rest = text.partition(":")
    if not colon or not index.strip().isdigit():
        raise MpiArgsError(f"--instance-mpi-local-args {text!r}: expected INSTANCE:ARGS, "
                           "e.g. 0:\"-x NAME=value\"")
    rest = rest.strip()
    if len(rest) >= 2 and rest[0] == rest[-1] and rest[0] in "\"'":
        rest = rest[1:-1]
    return int(index), rest


def local_interfaces() -> list[str]:
    """The network interfaces of this machine (of this network namespace), by index."""
    try:
        return [name for _, name in socket.if_nameindex()]
    except OSError:  # no such call on this platform: nothing to check against
        return []


def check_interface(mpirun_args: tuple[str, ...], *, remote_hosts: tuple[str, ...],
                    interfaces: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """``mpirun_args`` without an ``-iface IF`` that names no interface of this machine
    (``interfaces``), when every host of the job is this machine: Hydra would stop with
    "unable to find interface IF", and its instances talk on this machine anyway, so the
    flag has no effect here (one note). An interface this machine has is kept.

    Returns:
        ``(mpirun args, notes)``.

    Raises:
        MpiArgsError: with remote hosts, an interface this machine lacks (Hydra on this
            machine needs it to reach them): names it and this machine's interfaces.
    """
    words = list(mpirun_args)
    if "-iface" not in words[::2] or not interfaces:
        return tuple(words), []
    at = words[::2].index("-iface") * 2
    iface = words[at + 1]
    if iface in interfaces:
        return tuple(words), []
    if remote_hosts:
        raise MpiArgsError(
            f"mpirun -iface {iface} (from --mca btl_tcp_if_include/oob_tcp_if_include or "
            f"-iface): this machine has no interface {iface!r} (its interfaces: "
            f"{', '.join(interfaces)}), and mpirun here uses it to reach "
            f"{', '.join(remote_hosts)}")
    del words[at:at + 2]
    return tuple(words), [
        f"mpirun -iface {iface}: no effect in ipupod: this machine has no interface {iface!r} "
        f"(its interfaces: {', '.join(interfaces)}) and every host of the job is this machine"]
