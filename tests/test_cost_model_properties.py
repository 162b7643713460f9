"""Properties of the collective cost model across systems (issue 13): no steps in the bytes,
monotone in bytes and in CONSECUTIVE group size, ``auto`` the cheapest schedule, the
hierarchical and two-dimensional schedules where they pay, independence from the number of
host instances, and per-IPU shares of a multi-IPU replica."""

from __future__ import annotations

import functools

import pytest

from collectives.cost_model import HardwareCostModel
from collectives.schedules import CHAIN, CHAIN_STREAMS, RINGS, Pricer, folded_order
from ipu_node import get_system_model, route
from ipu_node.selection import assign_instance_ipus, layout_replicas

OPS = ("cross_replica_sum", "reduce_scatter", "all_gather", "broadcast", "all_to_all")
# one system per topology (the BOW-POD* share their POD's links: checked once below)
SYSTEMS = ("C2-16", "POD4", "POD16", "POD64", "POD128", "POD256")
# the POD128/POD256 sweeps take seconds each: in the slow layer (tests/conftest.py)
SYSTEM_CASES = [pytest.param(s, marks=pytest.mark.slow) if s in ("POD128", "POD256") else s
                for s in SYSTEMS]
RESNET50_FP16 = 25_557_032 * 2


@functools.lru_cache(maxsize=None)  # keep the step profiles between tests
def full(system: str) -> HardwareCostModel:
    m = get_system_model(system)
    return HardwareCostModel.for_replicas(m, m.num_ipus)


def consecutive(n: int, k: int) -> list[tuple[int, ...]]:
    return [tuple(range(g * k, g * k + k)) for g in range(n // k)]


@pytest.mark.parametrize("system", SYSTEM_CASES)
def test_no_step_and_monotone_in_bytes(system):
    cost = full(system)
    sizes = sorted({*range(1, 4200, 37), 2047, 2048, 2049, 8, 9, 1 << 16, 1 << 20,
                    RESNET50_FP16})
    for op in OPS:
        times = [cost.estimate(op, s) for s in sizes]
        assert all(b >= a for a, b in zip(times, times[1:])), op
        # no cliff, also around syncful.maxBroadcastSize: one more byte per member costs at
        # most that byte from every member over the slowest link (a GW-Link, 12.5 GB/s), in
        # each phase that carries it (all-reduce: reduce, then gather, nccl-tests' 2(n-1)/n;
        # the others one, as nccl-tests' bus bandwidth factor 1 of Broadcast and (n-1)/n of
        # ReduceScatter, AllGather, AlltoAll, anchors §5); reduce_scatter zero-pads to a
        # multiple of the group size, so its next size is one more element per member
        n = cost.model.num_ipus
        d = n if op == "reduce_scatter" else 1
        phases = 2 if op == "cross_replica_sum" else 1
        for s in (8, 2047, 2048, 4096):
            step = cost.estimate(op, (s + 1) * d) - cost.estimate(op, s * d)
            assert 0 <= step <= phases * n * d / 12.5e9, (op, s, step)


@pytest.mark.parametrize("system", SYSTEM_CASES)
def test_auto_is_never_beaten_by_a_flat_method(system):
    cost = full(system)
    for size in (8, 2049, 1 << 20, RESNET50_FP16):
        for op in ("cross_replica_sum", "reduce_scatter", "all_gather", "broadcast"):
            auto = cost.estimate(op, size)
            methods = tuple(RINGS) + (("broadcast",) if cost.model.num_ipus <= 64 else ())
            for method in methods:
                assert auto <= cost.estimate(op, size, method=method) * (1 + 1e-12), \
                    (op, size, method)


@pytest.mark.parametrize("system", SYSTEM_CASES)
def test_monotone_in_consecutive_group_size(system):
    """CONSECUTIVE(k) groups (all of them running at once) never get cheaper as k doubles,
    for every op but all_to_all, over the sizes of a ResNet-50 step and the latency-bound
    ones, on every system: half a POD64 included (see the next test)."""
    cost = full(system)
    n = cost.model.num_ipus
    sizes = (8, 2049, 1 << 16, 3 << 16, 1 << 18, 3 << 18, 1 << 20, 3 << 20, 1 << 23,
             RESNET50_FP16)
    for op in OPS[:-1]:
        for size in sizes:
            size *= n if op == "reduce_scatter" else 1   # a whole element per member
            k, prev = 2, 0.0
            while k <= n:
                t = cost.estimate(op, size, groups=consecutive(n, k))
                assert t >= prev, (op, size, k, prev, t)
                prev, k = t, k * 2


def test_half_a_pod64_runs_chains_along_its_open_ladder_sides():
    """Half a POD64 (CONSECUTIVE 32: 8 IPU-M2000s, an open ladder of 16 rungs) is never
    dearer than the whole (768 KiB: 47.7 against 49.7 us; 53.8 us before the chain): a
    reduce-scatter across each rung, an all-reduce along each ladder side as a chain (the
    side is open: no loopback cable closes it), an all-gather across each rung. The chain
    steps one IPU-Link at a time and crosses each link once per stream and direction, where a
    ring over the open side folds out and back (two IPU-Links a step, twice the flows)."""
    cost = full("POD64")
    half, whole = consecutive(64, 32), consecutive(64, 64)
    for size in (1 << 16, 3 << 18, 1 << 20):
        (t_half, name), t_whole = (cost.choose("cross_replica_sum", size, groups=half),
                                   cost.estimate("cross_replica_sum", size, groups=whole))
        assert t_half <= t_whole, (size, t_half, t_whole)
        assert name.startswith("hierarchical[row]") and f"all_reduce {CHAIN}[" in name, name
    inner, sides, k, d = cost.split(tuple(half), "row")
    assert (k, d) == (2, 16) and sides[:2] == (tuple(range(0, 32, 2)), tuple(range(1, 32, 2)))
    # the chain runs up the side one IPU-Link a step; the folded ring two
    chain = cost.chain_order(list(sides[0]))
    assert chain == list(range(0, 32, 2))
    assert {len(route(cost.model, a, b)) for a, b in zip(chain, chain[1:])} == {1}
    ring = cost.gcl_ring(list(sides[0]))
    assert max(len(route(cost.model, a, b)) for a, b in zip(ring, ring[1:] + ring[:1])) == 2
    # a chain step: one IPU-Link hop (0.5 us), one flow per stream and direction on each link
    # of the side: 2 streams run at a link's 16 GB/s, 4 share the 3 IPU-Links of a side
    # inside a machine (ipu_node.systems.M2000_SIDE_IPU_LINKS); the folded ring, 2 hops
    per_link = 16e9
    for streams, spb in ((2, 1 / per_link), (4, 4 / (3 * per_link))):
        (terms,) = cost.profile(sides, ("chain", streams)).terms
        assert terms == pytest.approx((0.5e-6, spb)), streams
    assert cost.profile(sides, ("ring", ((0, 1), (0, -1)))).terms[0][0] == \
        pytest.approx(1e-6)
    # 2(n-1) steps for an all-reduce, n-1 for a reduce-scatter or an all-gather, fragments of
    # S/(n * streams) (all-gather: S/streams)
    pricer = Pricer(cost)
    size = (3 << 18) / 2
    step = 0.5e-6 + size / (16 * 2) / per_link
    assert pricer.chain("all_reduce", sides, size, 2) == pytest.approx(30 * step)
    assert pricer.chain("reduce_scatter", sides, size, 2) == pytest.approx(15 * step)
    assert pricer.chain("all_gather", sides, size / 16, 2) == pytest.approx(15 * step)
    # and it beats GCL's rings on that side
    best_chain = min(pricer.chain("all_reduce", sides, size, s) for s in CHAIN_STREAMS)
    assert best_chain < min(pricer.flat("all_reduce", sides, size, m) for m in RINGS)


def test_the_ring_gcl_builds():
    """poplibs' RingTopology: replica ranks interleaved (0, 2, 4, ..., 5, 3, 1: the periphery
    of a ladder) or in order (closing over the torus' loopback cables)."""
    assert folded_order([0, 1, 2, 3, 4, 5]) == [0, 2, 4, 5, 3, 1]
    assert folded_order([7, 8, 9]) == [7, 9, 8]
    cost = full("POD64")
    assert cost.gcl_ring(list(range(8))) == [0, 2, 4, 6, 7, 5, 3, 1]     # periphery of 4 rungs
    assert cost.gcl_ring(list(range(0, 64, 2))) == list(range(0, 64, 2))  # a closed side
    assert cost.gcl_ring([0, 1]) == [0, 1]
    # every CONSECUTIVE group of a POD64 is a ring of its own links, one IPU-Link a step
    for k in (4, 8, 16, 32, 64):
        for g in consecutive(64, k):
            ring = cost.gcl_ring(list(g))
            assert {len(route(cost.model, a, b)) for a, b in zip(ring, ring[1:] + ring[:1])} \
                == {1}, k


def test_replicas_sit_where_the_runtime_puts_them():
    """The cost model lays replicas out as the runtime does (ipu_node.selection.
    layout_replicas): the device's gc-info listing order, a replica's stages in AUTO order."""
    for system, replicas, k, instances in (("POD16", 16, 1, 4), ("POD16", 4, 4, 2),
                                           ("POD64", 8, 8, 1), ("C2-16", 4, 4, 1),
                                           ("C2-16", 16, 1, 4), ("POD128", 16, 8, 2)):
        model = get_system_model(system)
        cost = HardwareCostModel.for_layout(model, instances, replicas // instances, k)
        runtime = [ipus[r * k:(r + 1) * k]
                   for ipus in assign_instance_ipus(model, instances, replicas // instances, k)
                   for r in range(len(ipus) // k)]
        assert [list(r) for r in cost.replica_ipus] == runtime, system
        assert cost.replica_ipus == HardwareCostModel.for_replicas(model, replicas, k).replica_ipus
    pod16 = get_system_model("POD16")
    assert layout_replicas(pod16, range(8), 1) == [[i] for i in range(8)]
    assert layout_replicas(pod16, range(8), 4) == [[0, 1, 3, 2], [4, 5, 7, 6]]   # SNAKE stages
    assert layout_replicas(get_system_model("C2-16"), [5, 7, 4, 6], 1) == [[5], [7], [4], [6]]


@pytest.mark.slow   # prices every size on POD128 and POD256: about 6 s of link flows
def test_bigger_pods_never_make_the_whole_pod_all_reduce_cheaper():
    """POD16 <= POD64 <= POD128 and POD64 <= POD256; POD128 <= POD256 but for the
    latency-bound tensors below about 2 KiB (8 bytes: 15.5 us on POD128, 14.0 us on POD256):
    POD256's GW-Link switch reaches every machine in one GW-Link hop (12 us between any two
    POD64s at 8 bytes), POD128's cross-connected cables only the twin machine, the rest over
    up to 16 more IPU-Link hops (anchors §2.5: "optical GW-Link cables cross connected"
    against "GW-Link switches")."""
    for size in (8, 2049, 1 << 20, RESNET50_FP16):
        t = {s: full(s).estimate("cross_replica_sum", size) for s in SYSTEMS[2:]}
        assert t["POD16"] <= t["POD64"] <= t["POD128"], size
        assert t["POD64"] <= t["POD256"], size
        if size > 2048:
            assert t["POD128"] <= t["POD256"], size


@pytest.mark.slow   # prices ResNet-50's gradients on POD128 and POD256: 4-7 s of link flows
def test_hierarchical_across_domains_on_pod128_and_pod256():
    """ResNet-50's gradients (fp16): reduce-scatter inside each POD64, all-reduce across,
    all-gather; far below the flat ring that crosses the GW-Links at every step."""
    for system in ("POD128", "POD256"):
        cost = full(system)
        t, name = cost.choose("cross_replica_sum", RESNET50_FP16)
        assert name.startswith("hierarchical[") and "hierarchical[domain](" in name, name
        ring = cost.estimate("cross_replica_sum", RESNET50_FP16,
                             method="bidirectional_ring_pair")
        assert t < ring / 2.5, (system, t, ring)
        assert t < 1.2 * full("POD64").estimate("cross_replica_sum", RESNET50_FP16)


def test_two_dimensional_schedule_on_the_pod64_torus():
    """The POD64 torus is a ladder of 32 rungs whose two sides the loopback cables close: its
    two dimensions are the IPU-M2000s (or the rungs) and the sides. They pay where latency
    counts (1 KiB, 1 MiB); for ResNet-50's gradients the quad ring, whose rings both run
    round the ladder's periphery, already uses the links of both dimensions."""
    cost = full("POD64")
    for size in (1024, 1 << 20):
        t, name = cost.choose("cross_replica_sum", size)
        flat = min(cost.estimate("cross_replica_sum", size, method=m) for m in RINGS)
        assert t < flat / 1.3 and name.startswith("hierarchical[machine]"), (size, name)
    t, name = cost.choose("cross_replica_sum", RESNET50_FP16)
    assert t < cost.estimate("cross_replica_sum", RESNET50_FP16,
                             method="bidirectional_ring_pair") / 1.9


@pytest.mark.parametrize("system,replicas", [("POD16", 16), ("POD64", 64), ("POD128", 128)])
def test_independent_of_the_number_of_host_instances(system, replicas):
    model = get_system_model(system)
    ref = HardwareCostModel.for_replicas(model, replicas)
    instances = 1
    while instances <= min(replicas, 32):
        cost = HardwareCostModel.for_layout(model, instances, replicas // instances)
        for size in (1024, RESNET50_FP16):
            for op in ("cross_replica_sum", "all_gather"):
                assert cost.estimate(op, size) == ref.estimate(op, size), (instances, op)
        instances *= 2


def test_bow_pods_price_as_their_pod():
    for name in ("POD16", "POD64"):
        assert full("BOW-" + name).estimate("cross_replica_sum", RESNET50_FP16) == \
            full(name).estimate("cross_replica_sum", RESNET50_FP16)


def test_pipelined_replica_reduces_each_stage_share_on_its_ipu():
    model = get_system_model("POD64")
    cost = HardwareCostModel.for_replicas(model, 16, ipus_per_replica=4)
    whole = cost.estimate("cross_replica_sum", RESNET50_FP16)       # all on the first IPU
    shares = cost.estimate_shares("cross_replica_sum", [RESNET50_FP16 // 4] * 4)
    assert shares < whole / 2
    # one stage alone is as cheap or cheaper than four at once (they share the links)
    alone = cost.estimate_shares("cross_replica_sum", [RESNET50_FP16 // 4, 0, 0, 0])
    assert alone <= shares
    assert cost.estimate_shares("cross_replica_sum", [RESNET50_FP16, 0, 0, 0]) == whole
    assert cost.estimate_shares("cross_replica_sum", [0, 0]) == 0
    with pytest.raises(ValueError, match="5 per-IPU shares, but a replica has only 4"):
        cost.estimate_shares("cross_replica_sum", [1] * 5)
    with pytest.raises(ValueError, match=">= 0"):
        cost.estimate_shares("cross_replica_sum", [-1])


def test_pipelined_replicas_price_the_same_whatever_the_instances():
    """examples/train_digits_pipelined.py's layout (4 replicas x 2 IPUs on POD16) at -n 1
    and -n 2: the same per-stage all-reduce (exec-pipeline's note: 6.45 vs 9.45 us before)."""
    model = get_system_model("POD16")
    one = HardwareCostModel.for_layout(model, 1, 4, ipus_per_replica=2)
    two = HardwareCostModel.for_layout(model, 2, 2, ipus_per_replica=2)
    shares = [64 * 10 * 4 + 10 * 4, 10 * 10 * 4 + 10 * 4]
    assert one.estimate_shares("cross_replica_sum", shares) == \
        two.estimate_shares("cross_replica_sum", shares) > 0
