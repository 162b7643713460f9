"""Run one instance's Python program so that a failure ends the whole job at once.

``python -m launch.bootstrap (script.py | -m module | -c command) [args...]`` runs the program
in this process, like ``python`` itself (and like ``python -m mpi4py``). If it raises, or exits
with a non-zero code, the bootstrap prints the traceback, writes the instance's error file
(``IPUPOD_ERROR_FILE``) and leaves with ``os._exit``: skipping ``MPI_Finalize``, which would
otherwise wait for the other instances for ever (DESIGN.md, known traps). mpirun (or poprun's
own supervisor) then stops the other instances. Started by poprun's local launcher
(``IPUPOD_PARENT_PID`` set), the instance also dies with poprun (PR_SET_PDEATHSIG), so no
instance outlives a poprun that was killed.

Under mpirun, which ends a job only when a process that started MPI fails, the program runs
behind a guard: ``--guard`` (a Python program: the bootstrap forks, the child runs the program,
the parent waits for it) or ``--exec program`` (any other program, run as a child). The guard
records an end that the program could not record itself (``os._exit``, a signal) in the error
file and ends the same way, so that poprun stops the job within about a second.

An instance of an MPI job (``IPUPOD_TRANSPORT=mpi``, two or more instances) whose program
ended without starting MPI (it never called a collective) starts it then: the others'
``MPI_Init`` waits for every instance, so without it an instance that calls its first
collective after this one has ended would wait in ``MPI_Init`` for ever. Then it waits
for the others in a barrier; those that call collectives instead never come, so after
:data:`protos.mpi_notice.ENDED_AFTER_S` it sends them the notice that its program has
ended, and they raise within seconds, naming it. (An instance that started MPI is said to
have ended by its MPI transport, :meth:`collectives.transports.mpi.transport.MPITransport.program_ended`.)
"""

from __future__ import annotations

import os
import resource
import runpy
import signal
import sys
import time
import traceback
from typing import Callable, NoReturn

from launch import env as envnames
from launch.errorfile import any_error_file, write_error_file
from launch.supervise import die_with_parent
from protos import mpi_notice

USAGE = ("usage: python -m launch.bootstrap [--guard] (script.py | -m module | -c command) "
         "[args...] | --exec program [args...]")
#: signals the guard of a non-Python program passes on to it
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _record(exit_code: int, error: str, tb: str, signum: int = 0) -> None:
    path = os.environ.get(envnames.ERROR_FILE)
    if path:
        instance = int(os.environ.get(envnames.INSTANCE_INDEX, "0"))
        try:
            write_error_file(path, instance, exit_code, error, tb, signal=signum)
        except OSError as exc:  # the job still has to end
            print(f"bootstrap: could not write the error file {path}: {exc}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()


def _fail(exit_code: int, error: str, tb: str) -> None:
    _record(exit_code, error, tb)
    os._exit(exit_code)


def _watch(send: Callable[[int], None], wait: Callable[[], int]) -> NoReturn:
    """The guard's part: pass the signals in :data:`_FORWARDED` on with ``send(signum)``,
    wait for the program (``wait()``: its status, negative for the signal that killed it),
    record a failure in the error file unless one is there already (the program's own
    bootstrap writes why it raised; ``os._exit``, a signal or a non-Python program write
    nothing), and end the way the program ended, so mpirun sees the same status as without
    the guard. A death by a signal that this guard passed on (mpirun or poprun stopping the
    job), or one after another instance recorded its failure (Hydra kills the others when an
    instance fails), is not recorded: it is not this instance's failure.
    """
    forwarded: set[int] = set()

    def forward(signum, _frame):
        forwarded.add(signum)
        send(signum)

    for signum in _FORWARDED:
        signal.signal(signum, forward)
    code = wait()
    path = os.environ.get(envnames.ERROR_FILE)
    recorded = bool(path) and os.path.exists(path)
    if code > 0:
        if not recorded:
            _record(code, "", "")
        os._exit(code)
    if code < 0:
        signum = -code
        stopped = signum in forwarded or (bool(path) and any_error_file(os.path.dirname(path)))
        if not recorded and not stopped:
            _record(0, "", "", signum=signum)
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)   # a signal that does not end a process by default
    os._exit(0)


def _guard(argv: list[str]) -> NoReturn:
    """Run a non-Python program as a child and end the way it ended (:func:`_watch`).

    The child dies with this guard (PR_SET_PDEATHSIG). Inherited file descriptors stay
    open (MPI programs need PMI's).
    """
    import subprocess
    try:
        proc = subprocess.Popen(argv, close_fds=False,
                                preexec_fn=lambda: die_with_parent(signal.SIGKILL))
    except OSError as exc:
        print(f"bootstrap: cannot run {argv[0]!r}: {exc.strerror}", file=sys.stderr)
        _fail(127, f"cannot run {argv[0]!r}: {exc.strerror}", "")
    _watch(proc.send_signal, proc.wait)


def _fork_guard() -> None:
    """``--guard``: fork; the child returns and runs the Python program in this interpreter
    (nothing but the standard library and :mod:`launch` is imported yet, no thread runs),
    and the parent stays behind as its guard (:func:`_watch`) and never returns.

    Without it, an instance whose process ends without a word (``os._exit``, a signal, the
    kernel's OOM killer) before it started MPI would leave the job running for ever: Hydra
    ends a job only when a process that started MPI fails, and nothing else tells poprun.
    The child dies with the guard (PR_SET_PDEATHSIG) and so with mpirun.
    """
    guard = os.getpid()
    pid = os.fork()
    if pid == 0:
        die_with_parent(signal.SIGKILL)
        if os.getppid() != guard:   # the guard died before the line above
            os._exit(128 + signal.SIGKILL)
        return

    def send(signum: int) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    _watch(send, lambda: os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))


def _run(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(USAGE)
    if argv[0] == "--exec":
        if len(argv) < 2:
            raise SystemExit(USAGE)
        _guard(argv[1:])
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit(USAGE)
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        if len(argv) < 2:
            raise SystemExit(USAGE)
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102
    else:
        script = argv[0]
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.realpath(script))
        runpy.run_path(script, run_name="__main__")


def _user_traceback(exc: BaseException) -> str:
    """The traceback without the frames of this bootstrap and runpy."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__)
                              or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _follow_parent() -> None:
    """Die with the launcher that set IPUPOD_PARENT_PID (it may be gone already)."""
    parent = os.environ.get(envnames.PARENT_PID)
    if not parent:
        return
    die_with_parent(signal.SIGKILL)
    if str(os.getppid()) != parent:
        os._exit(128 + signal.SIGKILL)


#: (requests, buffers) of what :func:`_end_mpi_instance` posted, alive until the end
_notices: list = []
#: seconds :func:`_end_mpi_instance` waits for its notices to leave (small messages leave at
#: once; a peer gone already must not hold the end up)
_NOTICE_SEND_S = 1.0


def _wait(MPI, requests: list, seconds: float) -> bool:
    """Whether ``requests`` complete within ``seconds`` (polled, yielding the CPU)."""
    deadline = time.monotonic() + seconds
    while not MPI.Request.Testall(requests):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


def _end_mpi_instance() -> None:
    """The program of an instance of an MPI job ended without starting MPI: start it (its
    ``MPI_Init`` returns once every instance has started MPI or ended), wait
    :data:`protos.mpi_notice.ENDED_AFTER_S` for the others in a barrier, and tell those that
    do not come that this one has ended (module docstring)."""
    if os.environ.get(envnames.TRANSPORT) != "mpi" or "mpi4py.MPI" in sys.modules:
        return
    try:
        count = int(os.environ.get(envnames.NUM_INSTANCES, "1"))
    except ValueError:
        return
    if count < 2:
        return
    from mpi4py import MPI  # noqa: PLC0415 - MPI_Init, only for this end
    world = MPI.COMM_WORLD
    barrier = world.Ibarrier()
    _notices.append(([barrier], None))
    if _wait(MPI, [barrier], mpi_notice.ENDED_AFTER_S):
        return   # every instance ended (none started MPI): nobody to tell
    me = world.Get_rank()
    buffer = mpi_notice.encode(mpi_notice.ENDED)
    requests = [world.Isend([buffer, MPI.BYTE], j, mpi_notice.TAG)
                for j in range(world.Get_size()) if j != me]
    _notices.append((requests, buffer))
    _wait(MPI, requests, _NOTICE_SEND_S)


def main(argv: list[str] | None = None) -> int:
    """Run the program; returns 0 on success (failures never return)."""
    argv = sys.argv[1:] if argv is None else argv
    _follow_parent()
    if argv[:1] == ["--guard"]:
        argv = argv[1:]
        if not argv:
            raise SystemExit(USAGE)
        _fork_guard()
    try:
        _run(argv)
    except SystemExit as exc:
        code = _exit_code(exc)
        if code != 0:
            _fail(code, f"SystemExit: {code}", "")
        _end_mpi_instance()
        return 0
    except BaseException as exc:  # noqa: BLE001 - anything else ends the job
        tb = _user_traceback(exc)
        sys.stderr.write(tb)
        _fail(1, f"{type(exc).__name__}: {exc}", tb)
    _end_mpi_instance()
    return 0


if __name__ == "__main__":
    sys.exit(main())
