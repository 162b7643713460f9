"""The public API of collectives (its pinned ``__all__``, its engine modules private) and the
transports' one list of names and one registry."""

import pytest

from tests.import_graph import REPO

# -- the collectives API ---------------------------------------------------------------------

COLLECTIVES_API = sorted([
    "cross_replica_sum", "cross_replica_mean", "cross_replica_reduce", "all_gather",
    "reduce_scatter", "all_to_all", "broadcast", "replication_index",
    "assume_equal_across_replicas", "CommGroup", "CommGroupType", "CollectiveOperator", "GCLOptions",
    "COLLECTIVE_OP_ADD", "COLLECTIVE_OP_MUL", "COLLECTIVE_OP_MIN", "COLLECTIVE_OP_MAX",
    "COLLECTIVE_OP_LOGICAL_AND", "COLLECTIVE_OP_LOGICAL_OR", "COLLECTIVE_OP_SQUARE_ADD",
    "COLLECTIVE_OP_LOCAL", "COLLECTIVE_OP_MEAN",
    "stats", "total_stats", "report", "call_records", "reset_stats", "set_cost_model",
    "CallRecord", "OpStats",
    "CollectiveError", "CollectiveMismatchError", "CollectiveTimeoutError",
    "CollectiveAbortedError", "CollectiveArgumentError", "CollectiveTypeError",
    "TransportError", "PeerLostError", "TransportClosedError",
])


def test_collectives_all_is_the_pinned_api():
    import collectives

    assert sorted(collectives.__all__) == COLLECTIVES_API
    assert len(set(collectives.__all__)) == len(collectives.__all__)
    missing = [n for n in collectives.__all__ if not hasattr(collectives, n)]
    assert not missing, missing


def test_the_engine_modules_of_collectives_are_private():
    public = {p.stem for p in (REPO / "collectives").glob("*.py") if not p.stem.startswith("_")}
    for internal in ("engine", "algorithms", "movement", "nest", "runtime", "accounting"):
        assert internal not in public, f"collectives.{internal} should be private"


# -- the transports: one list of names, one registry ----------------------------------------

def test_the_transport_names_and_the_registry_agree():
    from collectives.transports import registered_transports
    from ipu_node import IPUConfig
    from ipu_node.transport_names import INSTANCE_TRANSPORTS, TRANSPORT_NAMES
    from poprun.cli import build_parser

    assert registered_transports() == TRANSPORT_NAMES
    assert set(INSTANCE_TRANSPORTS) <= set(TRANSPORT_NAMES)
    (action,) = [a for a in build_parser()._actions if "--transport" in a.option_strings]
    assert tuple(action.choices) == INSTANCE_TRANSPORTS
    mrd = IPUConfig().experimental.multi_replica_distribution
    for name in TRANSPORT_NAMES:
        mrd.transport = name
    with pytest.raises(ValueError, match="'auto', 'local', 'mpi', 'grpc'"):
        mrd.transport = "carrier-pigeon"


def test_make_plan_checks_the_transport_against_the_names_it_is_given():
    from launch.plan import make_plan

    with pytest.raises(ValueError, match="unknown transport 'tcp'; known: mpi, grpc"):
        make_plan(["python", "x.py"], 2, transport="tcp", transports=("mpi", "grpc"))


def test_an_unknown_transport_name_is_refused_by_the_registry():
    from collectives.transports import create_transport, register_transport

    with pytest.raises(ValueError, match="unknown transport 'tcp'; known: local, mpi, grpc"):
        create_transport("tcp", 0, 1)
    with pytest.raises(ValueError, match="registered already"):
        register_transport("mpi", lambda *a, **k: None)
