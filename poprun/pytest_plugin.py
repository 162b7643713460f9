"""ipupod's pytest plugin: ``@pytest.mark.poprun(...)`` runs a test in every instance of an
emulated job, as pytest-mpi's ``@pytest.mark.mpi`` and torch's ``MultiProcessTestCase`` do.

Registered through the ``pytest11`` entry point (installing ipupod is enough); a suite that
runs from a checkout without installing names it: ``-p poprun.pytest_plugin``, or
``pytest_plugins = ["poprun.pytest_plugin"]`` in its root conftest.py.

    @pytest.mark.poprun(num_instances=2, num_replicas=4, ipus_per_replica=1,
                        transport="mpi", system="POD16", timeout=60)
    def test_shards(tmp_path):
        assert popdist.getNumInstances() == 2

The pytest process that collected the test (the *parent*) does not run it: it starts a job
the way ``poprun`` does (:func:`poprun.testing.start_job`), and every instance runs that one
test in a pytest session of its own, its fixtures resolved there (``tmp_path`` is the
instance's own). The test passes when every instance passes; it is skipped when every
instance skipped it. A failure names the instance(s) that failed (and the replica whose
replica function raised), with their tracebacks and output, and the others' state
(finished, stopped, timed out); each instance's output is also attached as report sections.
``timeout`` (seconds; default the ``poprun_timeout`` ini value, else
:data:`poprun.testing.DEFAULT_TIMEOUT_S`) is the job's hard timeout: the instances that have
not finished dump their stacks and are stopped, and the test fails naming them.

Tests without the marker run as they always do: this module imports nothing but ``os``,
pytest and the names of :mod:`launch.env` until a marked test runs (no MPI, gRPC, numpy or
torch at import).
"""

from __future__ import annotations

import os

import pytest

from launch import env as envnames

__all__ = ["MARKER"]

MARKER = "poprun"
#: the marker's keywords (the first may also be given by position: num_instances)
_KEYWORDS = ("num_instances", "num_replicas", "ipus_per_replica", "transport", "system",
             "timeout")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("poprun_timeout", "default hard timeout, in seconds, of the job of a test "
                  "marked poprun (ipupod)", default=None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "poprun(num_instances=2, num_replicas=None, ipus_per_replica=1, "
                   "transport=None, system=None, timeout=None): run the test in every instance "
                   "of an emulated poprun job (ipupod); it passes when every instance passes")


def _marker_options(item: pytest.Item, marker: pytest.Mark) -> dict:
    """The marker's keywords (``num_instances`` may come first by position).

    Raises:
        ValueError: unknown keywords, too many positional arguments, a bad ini value.
    """
    if len(marker.args) > 1:
        raise ValueError(f"{item.nodeid}: @pytest.mark.poprun takes num_instances by "
                                f"position and the rest by keyword; got {marker.args!r}")
    options = dict(zip(("num_instances",), marker.args))
    unknown = sorted(set(marker.kwargs) - set(_KEYWORDS))
    if unknown:
        raise ValueError(f"{item.nodeid}: @pytest.mark.poprun has no keyword "
                                f"{', '.join(unknown)}; known: {', '.join(_KEYWORDS)}")
    options.update(marker.kwargs)
    if options.get("timeout") is None:
        configured = item.config.getini("poprun_timeout")
        if configured:
            try:
                options["timeout"] = float(configured)
            except ValueError:
                raise ValueError(f"ini option poprun_timeout = {configured!r} is not a "
                                        "number of seconds") from None
    return options


def _plugin_args(config: pytest.Config) -> tuple[list[str], bool]:
    """``-p NAME`` for every plugin the parent loaded from an installed distribution, and
    the ``-p`` options of the parent's command line: the instances load the same plugins, so
    the same fixtures exist there. Second: whether the instances must scan the installed
    distributions for entry points themselves (a plugin that is not a module cannot be
    named); otherwise they do not (measured here: 0.37 s of every instance's start)."""
    found, scan = [], False
    for plugin, _ in config.pluginmanager.list_plugin_distinfo():
        name = getattr(plugin, "__name__", None)
        if not isinstance(name, str) or getattr(plugin, "__file__", None) is None:
            scan = True
        elif name != __name__:
            found += ["-p", name]
    args = list(config.invocation_params.args)
    for k, arg in enumerate(args):
        if arg == "-p" and k + 1 < len(args):
            found += ["-p", args[k + 1]]
        elif arg.startswith("-p") and len(arg) > 2:
            found += ["-p", arg[2:]]
    return found, scan


def _run_in_job(item: pytest.Item, marker: pytest.Mark) -> None:
    """The marked test's call phase in the parent: the job, then its verdict."""
    from poprun import testing
    try:
        options = _marker_options(item, marker)
    except ValueError as exc:
        pytest.fail(str(exc), pytrace=False)
    config = item.config
    plugins, scan = _plugin_args(config)
    args = testing.pytest_args(item.nodeid, str(config.rootpath),
                               str(config.inipath) if config.inipath else None,
                               str(config.getoption("importmode")), plugins)
    from ipu_node.errors import IPUError
    from launch.errors import LaunchError
    try:
        result = testing.start_job("pytest", {"pytest_args": args, "autoload": scan},
                                   **options)
    except (ValueError, TypeError, IPUError, LaunchError) as exc:   # nothing ran
        pytest.fail(f"@pytest.mark.poprun: the job did not start: {exc}", pytrace=False)
    for o in result.outcomes:
        for name in ("stdout", "stderr"):
            text = getattr(o, name)
            if text:
                item.add_report_section("call", f"instance {o.instance} {name}", text + "\n")
    if not result.passed:   # (the output: in the report sections above)
        pytest.fail(result.report(with_output=False), pytrace=False)
    if all(o.state == "skipped" for o in result.outcomes):
        pytest.skip(f"skipped in every instance: {result.outcomes[0].error}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """A marked test, in the parent: its reports come from the job, not from running it
    here (no fixture is set up in the parent)."""
    marker = item.get_closest_marker(MARKER)
    if marker is None or os.environ.get(envnames.PYTEST_JOB) \
            or not isinstance(item, pytest.Function):
        return None
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    setup_state = getattr(item.session, "_setupstate", None)
    phases = (("setup", lambda: None), ("call", lambda: _run_in_job(item, marker)),
              ("teardown", lambda: setup_state.teardown_exact(nextitem)
               if setup_state is not None else None))
    for when, step in phases:
        call = pytest.CallInfo.from_call(step, when=when,
                                         reraise=(pytest.exit.Exception, KeyboardInterrupt))
        report = ihook.pytest_runtest_makereport(item=item, call=call)
        ihook.pytest_runtest_logreport(report=report)
        if when == "setup" and not report.passed:
            break
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
