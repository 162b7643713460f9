"""The whole-step model (collectives.step_model): terms, what_if, validation, from_run."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import collectives as C
from tests.hw_fixtures import isolated  # noqa: F401
from collectives.cost_model import HardwareCostModel
from collectives.step_model import (DEFAULT_EFFICIENCY, TERMS, ModelCard, StepConfig, predict,
                                    what_if)
from ipu_node import get_system_model
from ipu_node.chips import GC200

R50 = ModelCard(25_557_032, 24.5e9, input_bytes_per_item=150_528)


def test_terms_add_up_and_compute_is_flops_over_peak():
    cfg = StepConfig("POD16", 16, micro_batch=20, gradient_accumulation=10, instances=8)
    est = predict(R50, cfg)
    b = est.breakdown
    assert set(TERMS) | {"host_io"} == set(b)
    assert est.step_s == pytest.approx(sum(b[t] for t in TERMS))
    assert b["compute"] == pytest.approx(
        10 * 20 * 24.5e9 / (GC200.peak_flops("float16") * DEFAULT_EFFICIENCY))
    assert b["bubble"] == 0
    cost = HardwareCostModel.for_replicas(get_system_model("POD16"), 16)
    assert b["allreduce"] == cost.estimate("cross_replica_sum", R50.grad_bytes)
    assert est.samples_per_s == pytest.approx(16 * 20 * 10 / est.step_s)
    # the input of 4 replicas shares a machine's 100 GbE; hidden behind compute here
    assert b["host_io"] == pytest.approx(4 * 200 * 150_528 / 12.5e9)
    assert b["host_io_exposed"] == 0
    assert predict(R50, cfg, efficiency=0.25).breakdown["compute"] == \
        pytest.approx(2 * b["compute"])


def test_pipeline_bubble_stage_shares_and_streaming_optimizer_state():
    bert = ModelCard(335_141_888, 1.02e12, samples_per_item=2, stage_shares=(1, 1, 1, 2),
                     optimizer_state_bytes_per_param=12, optimizer_state_in="streaming")
    cfg = StepConfig("POD16", 4, ipus_per_replica=4, micro_batch=2, gradient_accumulation=192)
    est = predict(bert, cfg)
    micro = 0.4 * 1.02e12 * 2 / (GC200.peak_flops("float16") * DEFAULT_EFFICIENCY)
    assert est.breakdown["compute"] == pytest.approx(192 * micro)   # the slowest stage
    assert est.breakdown["bubble"] == pytest.approx(3 * micro)
    in_sram = predict(ModelCard(335_141_888, 1.02e12, samples_per_item=2,
                                stage_shares=(1, 1, 1, 2), optimizer_state_bytes_per_param=12),
                      cfg)
    state = 0.4 * 335_141_888 * 12
    assert est.breakdown["weight_update"] - in_sram.breakdown["weight_update"] == \
        pytest.approx(2 * state / GC200.streaming_memory_bytes_per_s_per_ipu)
    # each stage reduces its own share on its own IPU, concurrently
    assert est.breakdown["allreduce"] < HardwareCostModel.for_replicas(
        get_system_model("POD16"), 4, 4).estimate("cross_replica_sum", bert.grad_bytes)
    text = est.table()
    for words in ("compute", "pipeline bubble", "host I/O", "all-reduce", "weight update",
                  "Streaming Memory", "samples/s", "all-reduce schedule", "assumption"):
        assert words in text, words


@pytest.mark.slow
def test_what_if_reprices_without_running_and_instances_change_nothing():
    cfg = StepConfig("POD16", 16, micro_batch=20, gradient_accumulation=10, instances=8)
    base = predict(R50, cfg)
    assert what_if(R50, cfg) == base
    assert what_if(R50, cfg, instances=1).step_s == base.step_s
    big = what_if(R50, cfg, system="POD128", replicas=128, gradient_accumulation=2,
                  instances=64)
    assert big == predict(R50, StepConfig("POD128", 128, micro_batch=20,
                                          gradient_accumulation=2, instances=64))
    assert big.samples_per_s > 5 * base.samples_per_s
    assert big.breakdown["allreduce"] > base.breakdown["allreduce"]
    bow = what_if(R50, cfg, system="BOW-POD16")
    assert bow.breakdown["compute"] == pytest.approx(base.breakdown["compute"] * 249.65625 / 350)
    with pytest.raises(ValueError, match="unknown change.*optimiser.*known: system"):
        what_if(R50, cfg, optimiser="sgd")


@pytest.mark.parametrize("make,match", [
    (lambda: ModelCard(0, 1.0), "params must be an integer > 0"),
    (lambda: ModelCard(10, 1.0, grad_dtype="bfloat16"), "grad_dtype"),
    (lambda: ModelCard(10, 1.0, optimizer_state_in="disk"), "optimizer_state_in"),
    (lambda: ModelCard(10, 1.0, stage_shares=()), "stage_shares"),
    (lambda: StepConfig("POD32", 4), "POD32"),
    (lambda: StepConfig("POD16", 17), "17 replicas x 1 IPUs = 17 IPUs do not fit POD16"),
    (lambda: StepConfig("POD16", 16, instances=3), "16 replicas cannot be divided .* 3"),
    (lambda: StepConfig("POD16", 4, micro_batch=0), "micro_batch must be an integer > 0"),
    (lambda: predict(R50, StepConfig("POD16", 4), efficiency=1.5), r"efficiency .* \(0, 1\]"),
    (lambda: predict(ModelCard(10, 1.0, stage_shares=(1, 1, 1)),
                     StepConfig("POD16", 4, ipus_per_replica=2)), "3 stages but .* 2 IPUs"),
])
def test_bad_input_is_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_toy_run_on_pod16_card_predict_and_what_if_agree(local_system):
    """A toy data-parallel program on POD16: its card from the run's ledger, predicted on
    the run's configuration, charges the all-reduce the run's ledger charged per step."""
    strategy = local_system(4)
    C.reset_stats()
    grads = np.ones(10_000, np.float16)
    steps = 3
    for _ in range(steps):
        strategy.run(lambda: C.cross_replica_sum(grads))
    card = ModelCard.from_run(C.call_records(), flops_per_item=1e9, steps=steps)
    assert card.params == 10_000 and card.grad_dtype == "float16"
    cfg = StepConfig("POD16", 4, micro_batch=8)
    est = predict(card, cfg)
    ran = C.stats()["cross_replica_sum"].modelled_s / steps
    assert est.breakdown["allreduce"] == pytest.approx(ran)
    assert what_if(card, cfg) == est
    assert what_if(card, StepConfig("POD16", 2, micro_batch=8), replicas=4) == est
    C.reset_stats()
    with pytest.raises(ValueError, match="no cross_replica"):
        ModelCard.from_run(C.call_records(), flops_per_item=1e9)


def test_card_from_a_pipelined_run_declares_its_flops(isolated):
    """Stage(flops=...) of a 2-stage pipeline on POD16: the card from its report has the
    declared FLOPs per item and equal stage shares, and predict's compute + bubble is the
    pipeline's modelled compute phase (Grouped, uniform stages)."""
    from ipu_node import clock
    from ipu_node.optimizers import GradientDescentOptimizer
    from ipu_node.pipelining_ops import OptimizerFunctionOutput, Stage, last_report, pipeline
    from tests.pipeline_models import ListOutfeed, configure, in_replica

    configure(2)
    f, b, g = 1e9, 2e9, 8

    def body():
        opt = GradientDescentOptimizer(0.1)
        stages = [Stage(lambda x: ((x,), None), lambda saved, d: ({}, (d[0],)),
                        flops=f, backward_flops=b) for _ in range(2)]
        pipeline(stages, g, inputs=[np.zeros(0, np.float32)], outfeed_queue=ListOutfeed(),
                 outfeed_mask=[True],
                 optimizer_function=lambda x: OptimizerFunctionOutput(opt, x))
        return last_report()

    report = in_replica(body)
    card = ModelCard.from_run(pipeline=report, micro_batch=4, params=1000,
                              grad_dtype="float32", infeed={})  # no input: no stream copies
    assert card.flops_per_item == pytest.approx(2 * (f + b) / 4)
    assert card.stage_shares == pytest.approx((0.5, 0.5))
    est = predict(card, StepConfig("POD16", 1, ipus_per_replica=2, micro_batch=4,
                                   gradient_accumulation=g), clock.compute_efficiency())
    assert est.breakdown["compute"] + est.breakdown["bubble"] == pytest.approx(
        report.compute_phase_s / max(report.repeat_count, 1))
    with pytest.raises(ValueError, match="flops_per_item or the run's pipeline report"):
        ModelCard.from_run(params=10)


def test_card_from_a_pipelined_run_with_an_infeed_reads_its_input_bytes(isolated):
    """A 2-stage pipeline of 2 replicas on POD16 fed by an IPUInfeedQueue of micro-batches
    of 4 items (x: 4x8 float32, y: 4 int64 = 160 bytes): the card's input bytes per item
    come from the queue (40), and predict on the card is what_if from the run."""
    from collectives.optimizers import CrossReplicaOptimizer
    from collectives.strategies import IPUMultiReplicaStrategy
    from ipu_node import Variable
    from ipu_node.data import Dataset
    from ipu_node.ipu_compiler import compile as ipu_compile
    from ipu_node.ipu_infeed_queue import IPUInfeedQueue, dequeued_bytes, reset_dequeued_bytes
    from ipu_node.optimizers import GradientDescentOptimizer
    from ipu_node.pipelining_ops import OptimizerFunctionOutput, last_report, pipeline
    from tests.pipeline_models import (ListOutfeed, configure, hidden_stage, init_weights,
                                       loss_stage, make_elements)

    replicas, g, repeats = 2, 4, 2
    configure(ipus_per_replica=2, replicas=replicas)
    weights = init_weights(5, sizes=(8, 16, 3))
    elements = make_elements(6, g * repeats * replicas)
    infeed = IPUInfeedQueue(Dataset.from_tensor_slices(
        (np.stack([x for x, _ in elements]), np.stack([y for _, y in elements]))))
    assert infeed.element_nbytes == 160
    reset_dequeued_bytes()
    C.reset_stats()

    def body():
        w0, w1 = (Variable(w, f"W{i}") for i, w in enumerate(weights))
        opt = CrossReplicaOptimizer(GradientDescentOptimizer(0.1))
        pipeline([hidden_stage(w0, first=True, flops=1e6), loss_stage(w1, flops=1e6)], g,
                 repeat_count=repeats, infeed_queue=infeed, outfeed_queue=ListOutfeed(),
                 optimizer_function=lambda loss: OptimizerFunctionOutput(opt, loss))
    with IPUMultiReplicaStrategy().scope():
        ipu_compile(body)
    fed = dequeued_bytes()[infeed.feed_name]
    assert fed == (160, {0: g * repeats, 1: g * repeats})
    card = ModelCard.from_run(C.call_records(), pipeline=last_report(), micro_batch=4,
                              steps=repeats)
    assert card.input_bytes_per_item == 40
    assert card.params == 8 * 16 + 16 * 3 and card.stage_shares == pytest.approx((0.5, 0.5))
    cfg = StepConfig("POD16", replicas, ipus_per_replica=2, micro_batch=4,
                     gradient_accumulation=g)
    est = predict(card, cfg)
    assert est.breakdown["host_io"] > 0
    assert what_if(card, StepConfig("POD16", 1, ipus_per_replica=2, micro_batch=4),
                   replicas=replicas, gradient_accumulation=g) == est
    assert ModelCard.from_run(C.call_records(), pipeline=last_report(), micro_batch=4,
                              steps=repeats, infeed={}).input_bytes_per_item == 0
    reset_dequeued_bytes()
    assert dequeued_bytes() == {}


def test_input_stream_copies_stop_the_ipu_without_io_tiles():
    """Each micro-batch's input is copied into the IPU from the Streaming Memory staging area
    at its share of the machine's 51.2 GB/s, the IPU computing nothing meanwhile (PopART's
    default); with IO tiles the copy overlaps compute."""
    cfg = StepConfig("POD16", 16, micro_batch=20, gradient_accumulation=10)
    est = predict(R50, cfg)
    per_micro = 1e-6 + 20 * 150_528 / (51.2e9 / 4)   # PCIe latency + 3.0 MB at 12.8 GB/s
    assert est.breakdown["stream_copy"] == pytest.approx(10 * per_micro)
    assert est.breakdown["norm_allreduce"] == 0
    overlapped = predict(dataclasses.replace(R50, io_tiles=64), cfg)
    assert overlapped.breakdown["stream_copy"] == 0
    assert est.step_s - overlapped.step_s == pytest.approx(10 * per_micro)
    assert "no IO tiles" in est.table() and "IO tiles" in overlapped.table()
    # a pipeline streams into its first stage only; a C2 card reads the host over PCIe
    two = predict(dataclasses.replace(R50, stage_shares=(1, 3)),
                  StepConfig("POD16", 8, ipus_per_replica=2, micro_batch=20))
    assert two.breakdown["stream_copy"] == 0 and two.breakdown["bubble"] == pytest.approx(
        two.breakdown["compute"])
    c2 = predict(R50, StepConfig("C2-16", 1, micro_batch=20))
    assert c2.breakdown["stream_copy"] == pytest.approx(1e-6 + 20 * 150_528 / 32e9)
    with pytest.raises(ValueError, match="io_tiles must be an integer >= 0"):
        ModelCard(1, 1.0, io_tiles=-1)


def _bn_card(group: int) -> ModelCard:
    from collectives.performance.compute_model import ComputeProfile, OpRecord

    ops = ComputeProfile.of([OpRecord("convolution", "conv", "float16", (1, 4000, 64, 9, 64),
                                      8_000_000, 2 * 4000 * 64 * 9 * 64)]
                            + [OpRecord("native_batch_norm", "normalisation", "float16", (64,),
                                        1_024_000)] * 2
                            + [OpRecord("native_batch_norm_backward", "normalisation",
                                        "float16", (64,), 2_048_000),
                               OpRecord("native_layer_norm", "normalisation", "float16", (),
                                        1_024_000)])
    return ModelCard(1000, 1e9, compute_ops=(ops,), compute_micro_batch=4,
                     distributed_batch_norm_replica_group_size=group)


def test_a_distributed_batch_norm_all_reduces_its_statistics_each_time_it_runs():
    """Every batch norm computing statistics (twice forward, as a recomputation does, once
    backward) sums 8 bytes a channel over its pair of replicas; a layer norm does not."""
    from collectives.performance.compute_model import SYNC_CYCLES

    cfg = StepConfig("POD16", 16, micro_batch=4, gradient_accumulation=5)
    est = predict(_bn_card(2), cfg)
    cost = HardwareCostModel.for_replicas(get_system_model("POD16"), 16)
    pairs = [(r, r + 1) for r in range(0, 16, 2)]
    one = cost.estimate("cross_replica_sum", 64 * 8, groups=pairs)
    # rung partners, one step: an IPU-Link's latency and 512 bytes at 16 GB/s
    assert one == pytest.approx(0.5e-6 + 512 / 16e9)
    assert est.breakdown["norm_allreduce"] == pytest.approx(
        5 * 3 * (one + SYNC_CYCLES / GC200.clock_hz))
    alone = predict(_bn_card(1), cfg)
    assert alone.breakdown["norm_allreduce"] == 0
    assert est.step_s - alone.step_s == pytest.approx(est.breakdown["norm_allreduce"])
    assert "groups of 2 replicas" in est.table()
    with pytest.raises(ValueError, match=r"replicas \(6\) to be a multiple of 4"):
        predict(_bn_card(4), StepConfig("POD16", 6, micro_batch=4))
