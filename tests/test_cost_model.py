"""The hardware cost model of the collectives: formulas, relations, and its use by default."""

import math

import numpy as np
import pytest

import collectives as C
from collectives.records import CallRecord, total
from collectives.cost_model import (HOST_NETWORK_BYTES_PER_S, HOST_NETWORK_LATENCY_S,
                                    HardwareCostModel)
from collectives.performance.link_flows import mirrored_ring
from ipu_node import get_system_model
from ipu_node.hardware.links import GW_LINK_BYTES_PER_S, IPU_LINK_BYTES_PER_S, IPU_LINK_LATENCY_S

MiB = 1 << 20
RINGS = ("clockwise_ring", "anticlockwise_ring", "bidirectional_ring_pair",
         "meet_in_middle_ring", "quad_directional_ring")


def model_of(system: str, replicas: int, instances: int = 1) -> HardwareCostModel:
    return HardwareCostModel.for_layout(get_system_model(system), instances,
                                        replicas // instances)


def test_ring_all_reduce_of_4_ipus_in_one_machine_by_hand():
    # POD16, replicas 0-3 on IPUs 0-3 of machine 0 (two rungs of the ladder): GCL's ring is
    # the periphery 0->2->3->1->0 (poplibs' interleaved ring), each hop one IPU-Link
    # (16 GB/s per direction, seed 001:247-248) of a direct bundle, 2(n-1) steps of S/n.
    cost = model_of("POD16", 4)
    assert [ipus[0] for ipus in cost.replica_ipus] == [0, 1, 2, 3]
    assert cost.gcl_ring([0, 1, 2, 3]) == [0, 2, 3, 1]
    n, size = 4, MiB
    step = IPU_LINK_LATENCY_S + (size / n) / IPU_LINK_BYTES_PER_S
    expected = 2 * (n - 1) * step
    assert cost.estimate("cross_replica_sum", size, method="clockwise_ring") == \
        pytest.approx(expected)
    # both directions at once, half the data each
    assert cost.estimate("cross_replica_sum", size, method="bidirectional_ring_pair") == \
        pytest.approx(2 * (n - 1) * (IPU_LINK_LATENCY_S + size / n / 2 / IPU_LINK_BYTES_PER_S))
    # meet in the middle: ceil((n-1)/2) steps of whole fragments per phase
    assert cost.estimate("cross_replica_sum", size, method="meet_in_middle_ring") == \
        pytest.approx(2 * math.ceil((n - 1) / 2) * step)
    # reduce-scatter is the first half, all-gather of S the second with S per step
    assert cost.estimate("reduce_scatter", size, method="clockwise_ring",
                         shape=(size // 4,)) == pytest.approx(expected / 2)
    assert cost.estimate("all_gather", size, method="clockwise_ring") == pytest.approx(
        (n - 1) * (IPU_LINK_LATENCY_S + size / IPU_LINK_BYTES_PER_S))


def test_reduce_scatter_pads_to_ceil_n_over_k():
    cost = model_of("POD16", 4)
    padded = cost.estimate("reduce_scatter", 4 * 5, method="clockwise_ring", shape=(5,))
    exact = cost.estimate("reduce_scatter", 4 * 8, method="clockwise_ring", shape=(8,))
    assert padded == pytest.approx(exact)  # ceil(5/4) = 2 elements, as for 8 elements


def test_crossing_gw_links_costs_more_than_staying_in_a_domain():
    pod64, pod128 = model_of("POD64", 64), model_of("POD128", 128)
    for method in RINGS:
        inside = pod64.estimate("cross_replica_sum", 100e6, method=method)
        across = pod128.estimate("cross_replica_sum", 100e6, method=method)
        # a flat ring across POD64s is limited by its GW-Link hop (12.5 GB/s) instead of an
        # IPU-Link (16 GB/s per direction)
        assert across > inside * IPU_LINK_BYTES_PER_S / GW_LINK_BYTES_PER_S, method
    # the same 2 replicas: neighbours in one domain vs one per POD64 of a POD128
    cost = model_of("POD128", 128)
    near = cost.estimate("cross_replica_sum", 64 * MiB, groups=[(0, 1)],
                         method="clockwise_ring")
    far = cost.estimate("cross_replica_sum", 64 * MiB, groups=[(0, 64)],
                        method="clockwise_ring")
    assert far > near * IPU_LINK_BYTES_PER_S / GW_LINK_BYTES_PER_S
    # limited by the GW-Link hop: one GW-Link per flow (anchors §2.5)
    assert far > 64 * MiB / 2 / GW_LINK_BYTES_PER_S


def test_bidirectional_and_quad_beat_one_ring_on_large_tensors():
    for system, n in (("POD16", 16), ("POD64", 64), ("C2-16", 16)):
        cost = model_of(system, n)
        cw = cost.estimate("cross_replica_sum", 100e6, method="clockwise_ring")
        acw = cost.estimate("cross_replica_sum", 100e6, method="anticlockwise_ring")
        bidir = cost.estimate("cross_replica_sum", 100e6, method="bidirectional_ring_pair")
        quad = cost.estimate("cross_replica_sum", 100e6, method="quad_directional_ring")
        assert cw == pytest.approx(acw)
        assert bidir < 0.6 * cw and quad < bidir, system


def test_mirrored_ring_is_hoof_on_the_c2_ladder():
    ladder = get_system_model("C2-16")
    assert mirrored_ring(ladder, [0, 1, 3, 2, 4, 5, 7, 6, 8, 9, 11, 10, 12, 13, 15, 14]) == \
        [0, 2, 4, 6, 8, 10, 12, 14, 15, 13, 11, 9, 7, 5, 3, 1]  # seed 004:1393
    # one IPU-M2000: two rungs, ring B is the ladder's periphery, as GCL's ring A
    assert mirrored_ring(get_system_model("POD4"), [0, 1, 2, 3]) == [0, 2, 3, 1]
    assert mirrored_ring(get_system_model("POD4"), [0, 1]) == [0, 1]   # one rung: no grid


def test_broadcast_method_wins_small_and_loses_large():
    for system, n in (("POD16", 4), ("POD16", 16), ("POD64", 64)):
        cost = model_of(system, n)
        small = 2048 // n  # at syncful.maxBroadcastSize (anchors §2.2)
        for method in RINGS:
            assert cost.estimate("cross_replica_sum", small, method="broadcast") < \
                cost.estimate("cross_replica_sum", small, method=method), (system, n, method)
        big = 64 * MiB  # every member sends (n-1)S, a ring 2(n-1)S/n
        assert cost.estimate("cross_replica_sum", big, method="broadcast") > \
            cost.estimate("cross_replica_sum", big, method="bidirectional_ring_pair")
        if n >= 16:
            assert cost.estimate("cross_replica_sum", big, method="broadcast") > \
                2 * cost.estimate("cross_replica_sum", big, method="clockwise_ring")


def test_auto_is_the_cheapest_schedule_whatever_max_broadcast_size():
    cost = model_of("POD16", 16)
    for size in (128, 129, 4096, 64 * MiB):
        flat = min(cost.estimate("cross_replica_sum", size, method=m) for m in RINGS + (
            "broadcast",))
        t, name = cost.choose("cross_replica_sum", size)
        assert t <= flat and t == cost.estimate("cross_replica_sum", size), size
        assert name != "auto"
    # small: every member sends to every other at once; middle: the torus' two dimensions
    # (the IPU-M2000s, then the ladder's sides closed by the loopback cables); large: the
    # quad ring, both of whose rings run round the ladder's periphery
    assert cost.choose("cross_replica_sum", 129)[1] == "broadcast"
    assert cost.choose("cross_replica_sum", MiB)[1].startswith("hierarchical[")
    assert cost.choose("cross_replica_sum", 64 * MiB)[1] == "quad_directional_ring"


def test_concurrent_groups_take_the_slowest_and_share_links():
    cost = model_of("POD16", 16)
    one = cost.estimate("cross_replica_sum", MiB, groups=[(0, 1, 2, 3)],
                        method="clockwise_ring")
    rows = cost.estimate("cross_replica_sum", MiB,
                         groups=[tuple(range(s, s + 4)) for s in range(0, 16, 4)],
                         method="clockwise_ring")
    assert rows >= one
    # ORTHOGONAL(8) groups {0,2,...,14}, {1,3,...,15} are the ladder's columns, closed by the
    # loopback cables: rings of neighbours, as CONSECUTIVE(8)'s rings (the periphery of
    # four rungs)
    strided = cost.estimate("cross_replica_sum", MiB,
                            groups=[tuple(range(g, 16, 2)) for g in range(2)],
                            method="clockwise_ring")
    halves = cost.estimate("cross_replica_sum", MiB, groups=[tuple(range(8)), tuple(range(8, 16))],
                           method="clockwise_ring")
    assert strided == pytest.approx(halves) and strided > one
    # ORTHOGONAL(2) pairs {g, g+8} are two machines apart and share the column links
    near = cost.estimate("cross_replica_sum", MiB, groups=[(2 * g, 2 * g + 1) for g in range(8)],
                         method="clockwise_ring")
    far = cost.estimate("cross_replica_sum", MiB, groups=[(g, g + 8) for g in range(8)],
                        method="clockwise_ring")
    assert far > near


def test_every_op_has_a_time_and_single_replica_groups_cost_nothing():
    cost = model_of("POD16", 8)
    for op in ("cross_replica_sum", "cross_replica_mean", "cross_replica_reduce",
               "reduce_scatter", "all_gather", "all_to_all", "broadcast"):
        for method in RINGS + ("broadcast", "auto"):
            assert cost.estimate(op, 4096, method=method, shape=(1024,)) > 0, (op, method)
            assert cost.estimate(op, 4096, method=method,
                                 groups=[(r,) for r in range(8)], shape=(1024,)) == 0
    with pytest.raises(ValueError, match="knows no collective"):
        cost.estimate("gossip", 8)
    with pytest.raises(ValueError, match="unknown GCL method"):
        cost.estimate("all_gather", 8, method="star")
    with pytest.raises(ValueError, match="outside"):
        cost.estimate("all_gather", 8, groups=[(0, 9)])


def test_host_collectives_go_over_the_network():
    assert model_of("POD16", 4).estimate("host reduce", MiB) == 0  # one instance
    cost = model_of("POD16", 8, instances=4)
    m = 4
    ring = 2 * (m - 1) * (HOST_NETWORK_LATENCY_S + MiB / m / HOST_NETWORK_BYTES_PER_S)
    assert cost.estimate("host reduce", MiB) == pytest.approx(ring)
    tree = 2 * (HOST_NETWORK_LATENCY_S + 8 / HOST_NETWORK_BYTES_PER_S)
    assert cost.estimate("host broadcast", 8) == pytest.approx(tree)
    assert cost.estimate("host broadcast", MiB) == pytest.approx(ring)


def test_layout_of_several_instances():
    cost = model_of("POD16", 8, instances=2)
    assert [ipus[0] for ipus in cost.replica_ipus] == [0, 1, 2, 3, 4, 5, 6, 7]
    two_ipus = HardwareCostModel.for_layout(get_system_model("POD16"), 2, 2, 2)
    assert two_ipus.replica_ipus == ((0, 1), (2, 3), (4, 5), (6, 7))


def test_cost_model_reads_the_record():
    cost = model_of("POD16", 4)
    record = CallRecord(op="cross_replica_sum", operator="COLLECTIVE_OP_ADD",
                        method="quad_directional_ring", dtype="float32", shape=(1024,),
                        nbytes=4096, group="ALL(0)", groups=((0, 1, 2, 3),),
                        ipus_per_replica=1, transport_bytes=0, wall_s=0.0)
    assert cost(record) == cost.estimate("cross_replica_sum", 4096,
                                         method="quad_directional_ring")


# -- installed by default -----------------------------------------------------------------

def test_strategy_run_records_modelled_time_per_op(local_system):
    strategy = local_system(4)
    C.reset_stats()
    x = np.ones(1 << 16, np.float32)

    def step():
        return (C.cross_replica_sum(x), C.cross_replica_mean(x), C.all_gather(x[:8]),
                C.reduce_scatter(x), C.all_to_all(x.reshape(4, -1), 0, 0), C.broadcast(x))

    strategy.run(step)
    strategy.reduce("SUM", strategy.run(lambda: np.float32(1)))
    strategy.broadcast(np.ones(3))
    stats = C.stats()
    assert set(stats) == {"cross_replica_sum", "cross_replica_mean", "all_gather",
                          "reduce_scatter", "all_to_all", "broadcast", "host reduce",
                          "host broadcast"}
    for op, s in stats.items():
        assert s.modelled_s is not None, op
        assert s.modelled_s > 0 or op.startswith("host"), op  # one instance: no network
    records = C.call_records()
    assert all(r.modelled_s is not None for r in records)
    tot = C.total_stats()
    assert tot.calls == len(records) == sum(s.calls for s in stats.values())
    assert tot.modelled_s == pytest.approx(sum(r.modelled_s for r in records))
    assert tot.wall_s == pytest.approx(sum(r.wall_s for r in records))
    assert tot.payload_bytes == sum(r.nbytes for r in records)
    assert total(stats).modelled_s == tot.modelled_s
    text = C.report()
    assert "cross_replica_sum" in text and "total" in text and "modelled s" in text
    expected = model_of("POD16", 4).estimate("cross_replica_sum", x.nbytes)
    assert stats["cross_replica_sum"].modelled_s == pytest.approx(expected)


def test_gcl_method_changes_modelled_time_never_results(monkeypatch, local_system):
    x = [np.random.default_rng(r).standard_normal(1 << 14) for r in range(4)]
    seen = {}
    for method in RINGS + ("broadcast",):
        monkeypatch.setenv("GCL_OPTIONS", f'{{"method": "{method}"}}')
        strategy = local_system(4)
        C.reset_stats()
        out = strategy.run(lambda: C.cross_replica_sum(x[C.replication_index()]))
        seen[method] = (out[0].tobytes(), C.stats()["cross_replica_sum"].modelled_s)
    assert len({result for result, _ in seen.values()}) == 1
    times = {method: t for method, (_, t) in seen.items()}
    assert times["bidirectional_ring_pair"] < times["clockwise_ring"]
    assert len(set(times.values())) >= 4


def test_set_cost_model_overrides_the_default(local_system):
    strategy = local_system(2)
    C.set_cost_model(lambda record: 1.0)
    try:
        C.reset_stats()
        strategy.run(lambda: C.cross_replica_sum(np.ones(4)))
        assert C.stats()["cross_replica_sum"].modelled_s == 1.0
    finally:
        C.set_cost_model(None)
    C.reset_stats()
    strategy.run(lambda: C.cross_replica_sum(np.ones(4)))
    assert 0 < C.stats()["cross_replica_sum"].modelled_s < 1e-3


@pytest.mark.parametrize("system", ["C2-16", "POD16", "POD128"])
def test_routes_from_is_route_to_every_ipu(system):
    from ipu_node.hardware.routing import route, routes_from
    model = get_system_model(system)
    for src in (0, 5, model.num_ipus - 1):
        routes = routes_from(model, src)
        assert all(list(routes[dst]) == route(model, src, dst)
                   for dst in range(model.num_ipus))
