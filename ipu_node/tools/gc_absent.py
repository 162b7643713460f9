"""The seed's other gc-* tools (seed 001:567-590), which test or expose hardware the
emulation has not got: each answers in one line what it would do and why it does nothing
here, and exits 0 (nothing failed), except ``gc-docker``, which cannot do what it is asked
(exit 1).

=====================  ====================================================================
``gc-exchangetest``    "test the internal exchange fabric in an IPU" (seed 001:575)
``gc-memorytest``      "Tests all the memory in an IPU, reporting any tiles that fail"
                       (seed 001:577)
``gc-powertest``       "Tests power consumption and temperature" (seed 001:583)
``gc-docker``          "use IPU devices in Docker containers" (seed 001:589)
=====================  ====================================================================
"""

from __future__ import annotations

import sys
from typing import Callable

from ipu_node.tools._common import EXIT_USAGE, model_or_none, parser

#: tool -> (what the real tool does, why nothing is done here, exit status)
ANSWERS = {
    "gc-exchangetest": ("tests the internal exchange fabric of an IPU",
                        "the emulated IPUs have no tiles and no exchange to test: replicas "
                        "run in numpy on this machine's CPUs", 0),
    "gc-memorytest": ("tests all the In-Processor-Memory of an IPU, tile by tile",
                      "the emulated IPUs' memory is this machine's RAM, counted per IPU "
                      "(see the run report), with no tiles that could fail", 0),
    "gc-powertest": ("tests the power consumption and temperature of the IPU cards",
                     "the emulation models no power or temperature (gc-monitor shows N/A)",
                     0),
    "gc-docker": ("passes IPU devices into a Docker container",
                  "the emulated IPUs are not devices: install ipupod inside the container "
                  "and run the job there", 1),
}


def answer(tool: str, system: str) -> str:
    """The one line ``tool`` prints on ``system``."""
    does, why, _ = ANSWERS[tool]
    return f"{tool}: nothing to do on the emulated {system}: the real tool {does}; {why}"


def _main_of(tool: str) -> Callable[[list[str] | None], int]:
    def main(argv: list[str] | None = None) -> int:
        p = parser(tool, f"The real {tool} {ANSWERS[tool][0]}: not emulated (says so in "
                         "one line); its options are accepted and not used.")
        args, _ = p.parse_known_args(argv)
        model = model_or_none(tool, args.system)
        if model is None:
            return EXIT_USAGE
        print(answer(tool, model.name), file=sys.stderr if ANSWERS[tool][2] else sys.stdout)
        return ANSWERS[tool][2]
    main.__name__ = main.__qualname__ = tool.replace("-", "_")
    main.__doc__ = f"``{tool}``: one line saying it has nothing to test; the exit status."
    return main


exchangetest = _main_of("gc-exchangetest")
memorytest = _main_of("gc-memorytest")
powertest = _main_of("gc-powertest")
docker = _main_of("gc-docker")
