"""What starting a test job costs: ``poprun.testing.run_job`` and the ``poprun`` pytest
marker against a plain ``poprun -n 2`` of the same program, side by side in one run.

The program is a 2-instance numpy job (each instance multiplies a 256x256 matrix by itself,
a few milliseconds: the test's own work). Contenders, each timed from the call to the end of
the job (wall seconds):

  alone        ``python prog.py``: one interpreter, the work once (the floor)
  poprun       ``python -m poprun -n 2 python prog.py`` in a subprocess (the baseline: what a
               test does without the plugin)
  run_job      ``run_job(prog.work, num_instances=2)`` in this process
  marker       the job of a test marked ``@pytest.mark.poprun(num_instances=2)``: each
               instance runs that one test in a pytest session of its own
               (:func:`poprun.testing.start_job`, as the plugin calls it)

each for the transports ``mpi`` (mpirun) and ``grpc`` (poprun's own launcher). They run in
interleaved rounds (a shuffled order every round) and the median round counts; the ratios to
``poprun`` of the same transport compare across runs, the seconds only on this machine.

    python benchmarks/job_start.py [--rounds 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

# This folder holds collectives.py, which would shadow the package of that name.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0:1] = [_ROOT]

from poprun.testing import run_job, start_job, pytest_args  # noqa: E402

PROGRAM = '''
import numpy as np
from poprun import popdist

def work():
    x = np.random.default_rng(popdist.getInstanceIndex()).standard_normal((256, 256))
    return float((x @ x).sum())

if __name__ == "__main__":
    work()
'''

TEST = '''
import pytest
from jobstart_prog import work

@pytest.mark.poprun(num_instances=2)
def test_work():
    work()
'''


def _contenders(directory: str, transport: str) -> dict:
    prog = os.path.join(directory, "jobstart_prog.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([_ROOT, directory])}
    launcher = ["--launcher", "mpirun"] if transport == "mpi" else ["--launcher", "local"]
    import jobstart_prog
    args = pytest_args("test_jobstart.py::test_work", directory, None, "prepend",
                       ["-p", "poprun.pytest_plugin"])

    def poprun():
        subprocess.run([sys.executable, "-m", "poprun", "-n", "2", *launcher,
                        "--transport", transport, sys.executable, prog], check=True,
                       env=env, cwd=directory, stdout=subprocess.DEVNULL)

    def marker():
        result = start_job("pytest", {"pytest_args": args}, num_instances=2,
                           transport=transport)
        assert result.passed, result.report()

    return {"poprun": poprun,
            "run_job": lambda: run_job(jobstart_prog.work, num_instances=2,
                                       transport=transport),
            "marker": marker}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="write the results here")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="jobstart-") as directory:
        with open(os.path.join(directory, "jobstart_prog.py"), "w") as f:
            f.write(textwrap.dedent(PROGRAM))
        with open(os.path.join(directory, "test_jobstart.py"), "w") as f:
            f.write(textwrap.dedent(TEST))
        sys.path.insert(0, directory)
        os.chdir(directory)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([_ROOT, directory])}
        fns = {"alone": lambda: subprocess.run(
            [sys.executable, os.path.join(directory, "jobstart_prog.py")], check=True,
            env=env)}
        for transport in ("mpi", "grpc"):
            for name, fn in _contenders(directory, transport).items():
                fns[f"{name} {transport}"] = fn
        times = {name: [] for name in fns}
        order = random.Random(0)
        for name, fn in fns.items():   # warm: the file cache, the first MPI start
            fn()
        for _ in range(options.rounds):
            names = list(fns)
            order.shuffle(names)
            for name in names:
                started = time.perf_counter()
                fns[name]()
                times[name].append(time.perf_counter() - started)
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"job start, 2 instances, median of {options.rounds} rounds "
          f"({os.cpu_count()} cores; wall seconds of this run, ratios to poprun -n 2)")
    print(f"{'contender':<14}{'seconds':>9}{'vs poprun':>11}{'beyond alone':>14}")
    for name, median in medians.items():
        transport = name.split()[-1]
        base = medians.get(f"poprun {transport}")
        ratio = f"{median / base:.2f}" if base and name != "alone" else "-"
        print(f"{name:<14}{median:>9.3f}{ratio:>11}{median - medians['alone']:>14.3f}")
    if options.json:
        with open(options.json, "w") as f:
            json.dump({"rounds": options.rounds, "cores": os.cpu_count(),
                       "median_s": medians, "times_s": times}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
