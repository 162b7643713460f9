"""pipelining_ops.pipeline: the oracles of reference execution-model.md §3 (O1 numbers, O4
outfeed values) and the argument rules of §1.3/§1.9 with their messages."""

import numpy as np
import pytest

import ipu_node
from ipu_node import Variable
from ipu_node.errors import FailedPreconditionError
from ipu_node.optimizers import (GradientAccumulationOptimizerV2, GradientDescentOptimizer,
                                 MomentumOptimizer)
from ipu_node.pipelining_ops import (OptimizerFunctionOutput, PipelineSchedule,
                                     PipelineStageOptions, RecomputationMode, Stage,
                                     last_report, pipeline)
from tests.hw_fixtures import isolated  # noqa: F401
from tests.pipeline_models import (ListInfeed, ListOutfeed, configure, grad_sums, grads_of,
                                   in_replica, init_weights, make_elements, mlp_stages,
                                   oracle)

G, REPEATS, LR = 12, 2, 0.05


def _train(schedule, weights, elements, stages_of=mlp_stages, **kw):
    def body():
        variables = [Variable(w, f"W{i}") for i, w in enumerate(weights)]
        opt = GradientDescentOptimizer(LR)
        outfeed = ListOutfeed()
        pipeline(stages_of(variables), G, repeat_count=REPEATS,
                 infeed_queue=ListInfeed(elements), outfeed_queue=outfeed,
                 optimizer_function=lambda loss: OptimizerFunctionOutput(opt, loss),
                 pipeline_schedule=schedule, **kw)
        return [v.value for v in variables], outfeed.items, last_report()
    return in_replica(body)


@pytest.mark.parametrize("stages", [2, 3])
def test_o1_every_schedule_equals_the_accumulating_numpy_loop_bit_for_bit(isolated, stages):
    configure(ipus_per_replica=stages)
    weights = init_weights(1, sizes=(8, 16, 12, 3) if stages == 3 else (8, 16, 3))
    elements = make_elements(2, G * REPEATS)
    expected_w, expected_losses = oracle(weights, elements, G, REPEATS, LR)
    for schedule in PipelineSchedule:
        final, outfed, report = _train(schedule, weights, elements)
        for w, e in zip(final, expected_w):
            assert w.dtype == e.dtype and w.tobytes() == e.tobytes(), schedule
        # training outfeeds the unmasked outputs as a list, even one (reference §1.5)
        assert [item[0] for item in outfed] == expected_losses
        assert report.schedule == schedule.name and report.training


def test_o1_recomputation_changes_no_number_and_charges_the_extra_forward(isolated):
    weights, elements = init_weights(1, sizes=(8, 16, 3)), make_elements(2, G * REPEATS)
    configure(ipus_per_replica=2)
    base = _train(PipelineSchedule.Grouped, weights, elements)
    configure(ipus_per_replica=2, allow_recompute=True)
    again = _train(PipelineSchedule.Grouped, weights, elements,
                   recomputation_mode=RecomputationMode.RecomputeThenBackpropagate)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(base[0], again[0]))
    assert again[2].recompute and not base[2].recompute


def test_variables_move_to_their_stage_ipu_and_the_stash_is_accounted(isolated):
    system = configure(ipus_per_replica=2)
    weights, elements = init_weights(1, sizes=(8, 16, 3)), make_elements(2, G * REPEATS)

    def body():
        v0, v1 = Variable(weights[0], "W0"), Variable(weights[1], "W1")
        opt = GradientDescentOptimizer(LR)
        pipeline(mlp_stages([v0, v1]), G, infeed_queue=ListInfeed(elements),
                 outfeed_queue=ListOutfeed(),
                 optimizer_function=lambda loss: OptimizerFunctionOutput(opt, loss))
        return v0.ipu_id, v1.ipu_id
    ids = in_replica(body)
    ipus = [ipu.id for ipu in system.devices[0].ipus]
    assert ids == (ipus[0], ipus[1])
    usage = ipu_node.memory_usage()
    # stage 0 stashes 3 micro-batches (Grouped, S=2: 2(S-s)-1) of (x, z)
    stash0 = 3 * (4 * 8 * 4 + 4 * 16 * 4)  # (the run above: G=12, stage 0 stash 3)
    assert usage[ipus[0]].peak_bytes >= weights[0].nbytes + stash0
    assert usage[ipus[0]].in_use_bytes == 0  # variables freed, stash freed


def test_momentum_and_mean_reduction(isolated):
    configure(ipus_per_replica=2)
    weights, elements = init_weights(3, sizes=(8, 16, 3)), make_elements(4, 4)

    def body():
        vs = [Variable(w) for w in weights]
        opt = MomentumOptimizer(0.1, 0.9)
        pipeline(mlp_stages(vs), 4, repeat_count=1, infeed_queue=ListInfeed(elements),
                 outfeed_queue=ListOutfeed(), reduction_method="MEAN",
                 optimizer_function=lambda loss: OptimizerFunctionOutput(opt, loss))
        return [v.value for v in vs], [opt.get_slot(v, "momentum").value for v in vs]
    final, slots = in_replica(body)
    sums = grad_sums(weights, elements)
    for w, s, f, slot in zip(weights, sums, final, slots):
        mean = s / np.float32(4)
        np.testing.assert_array_equal(slot, mean)
        np.testing.assert_array_equal(f, w - np.float32(0.1) * mean)


def test_outfeed_values_of_the_reference_table(isolated):
    """Reference §1.5 (PT rows): inference outputs; outfeed_mask; outfeed_loss;
    accumulate_outfeed with and without outfeed_loss."""
    configure(ipus_per_replica=4)
    def inference():
        out = ListOutfeed()
        pipeline([lambda x: 2 * x, lambda x: x + 1, lambda x: x + 1, lambda x: x + 1], 8,
                 inputs=[np.float32(42.0)], outfeed_queue=out,
                 pipeline_schedule=PipelineSchedule.Interleaved)
        return out.items
    assert [float(v) for v in in_replica(inference)] == [87.0] * 8

    def training(**kw):
        def body():
            w = Variable(np.float32(1.0), "w")
            x = np.float32(0.0)

            def s0(x):
                return (w.value * x,), None

            def s_id(x):
                return (x,), None

            def last(x):
                return (x + np.float32(1.0), np.float32(4.0)), None

            def bwd_var(saved, d):
                return {w: np.float32(0.0)}, None

            def bwd(saved, d):
                return {}, (d[0],)
            stages = [Stage(s0, bwd_var), Stage(s_id, bwd), Stage(s_id, bwd), Stage(last, bwd)]
            out = ListOutfeed()
            opt = GradientDescentOptimizer(0.1)
            pipeline(stages, 8, inputs=[x], outfeed_queue=out,
                     optimizer_function=lambda loss, x2: OptimizerFunctionOutput(opt, loss),
                     **kw)
            return out.items
        return in_replica(body)
    assert [float(v) for v in training(outfeed_loss=True)] == [1.0] * 8
    masked = training(outfeed_mask=[True, False])
    assert len(masked) == 8 and all(isinstance(m, list) and m == [4.0] for m in masked)
    assert [float(v) for v in training(outfeed_loss=True, accumulate_outfeed=True)] == [8.0]
    summed = training(accumulate_outfeed=True)
    assert len(summed) == 1 and [float(v) for v in summed[0]] == [8.0, 32.0]


def _body_with(**kw):
    def body():
        def f(x):
            return (x,), None

        def b(saved, d):
            return {}, (d,)
        stages = kw.pop("stages", [Stage(f, b), Stage(f, b)])
        args = dict(gradient_accumulation_count=4, inputs=[np.zeros(2)],
                    outfeed_queue=ListOutfeed(),
                    optimizer_function=lambda x: OptimizerFunctionOutput(
                        GradientDescentOptimizer(0.1), x))
        args.update(kw)
        pipeline(stages, **args)
    return body


@pytest.mark.parametrize("kw, error, message", [
    (dict(gradient_accumulation_count=None), ValueError,
     "gradient_accumulation_count must be specified."),
    (dict(gradient_accumulation_count=-1), ValueError,
     "gradient_accumulation_count must be >= 0."),
    (dict(gradient_accumulation_count=2**31), ValueError,
     "gradient_accumulation_count must be < max int32."),
    (dict(continuous_weight_updates=True), NotImplementedError,
     "Continuous weight updates are currently not supported."),
    (dict(stages=[Stage(lambda x: ((x,), None), lambda s, d: ({}, d))]), ValueError,
     "Pipeline requires at least two computational stages."),
    (dict(device_mapping=0), TypeError,
     "device_mapping argument needs to be a list or a tuple."),
    (dict(device_mapping=[0]), ValueError,
     "Each stage must be mapped to an IPU: 1 mappings != 2 stages"),
    (dict(device_mapping=[0, 2]), ValueError,
     "device_mapping[1] (stage 1) is 2, not an IPU of the replica"),
    (dict(pipeline_schedule="Grouped"), TypeError,
     "is not a member of the PipelineSchedule enumeration."),
    (dict(recomputation_mode=1), TypeError,
     "is not a member of the RecomputationMode enumeration."),
    (dict(pipeline_schedule=PipelineSchedule.Interleaved, device_mapping=[0, 0]),
     NotImplementedError, "The pipelining schedule 'Interleaved' does not currently support"),
    (dict(batch_serialization_iterations=2, pipeline_schedule=PipelineSchedule.Grouped),
     NotImplementedError, "Batch serialization is only supported with the `Sequential`"),
    (dict(optimizer_function=None, outfeed_mask=[False]), ValueError,
     "An optimizer_function must be provided when outfeed_mask is set."),
    (dict(optimizer_function=None, outfeed_loss=True), ValueError,
     "An optimizer_function must be provided when outfeed_loss is True."),
    (dict(outfeed_loss=True, outfeed_mask=[False]), ValueError,
     "Only one of `outfeed_loss` and `outfeed_mask` can be set."),
    (dict(outfeed_loss=True, outfeed_queue=None), ValueError,
     "An outfeed_queue must be provided when outfeed_loss is True"),
    (dict(accumulate_outfeed=True, outfeed_queue=None), ValueError,
     "An outfeed_queue must be provided when accumulate_outfeed is True."),
    (dict(outfeed_queue=None), ValueError,
     "The last computational stage has tensor outputs: "),
    (dict(outfeed_mask=[False, True]), ValueError,
     "The last computational stage has 1 outputs, but the `outfeed_mask` has 2 elements."),
    (dict(forward_propagation_stages_poplar_options=[PipelineStageOptions()]), ValueError,
     "forward_propagation_stages_poplar_options must be a list of 2 PipelineStageOptions"),
    (dict(weight_update_poplar_options={}), TypeError,
     "weight_update_poplar_options must be a PipelineStageOptions"),
    (dict(gradient_accumulation_count=6), FailedPreconditionError,
     "The number of iterations of the pipeline must be a multiple of 4, but it is 6."),
    (dict(gradient_accumulation_count=0), FailedPreconditionError,
     "The number of iterations of the pipeline must be at least 4, but it is 0."),
    (dict(optimizer_function=lambda x: OptimizerFunctionOutput(
        GradientDescentOptimizer(0.1), np.zeros(2))), ValueError,
     "optimizer_function's loss must be one of the last computational stage's outputs"),
    (dict(optimizer_function=lambda x: OptimizerFunctionOutput(
        GradientAccumulationOptimizerV2(GradientDescentOptimizer(0.1), 2), x)), ValueError,
     "cannot be used in a pipeline"),
])
def test_argument_errors_carry_tf_ipus_messages(isolated, kw, error, message):
    configure(ipus_per_replica=2)
    with pytest.raises(error) as info:
        in_replica(_body_with(**kw))
    assert message in str(info.value)


def test_accumulate_outfeed_needs_an_all_outfeed(isolated):
    configure(ipus_per_replica=2)
    last = ListOutfeed()
    last.outfeed_mode = type("Mode", (), {"value": "get_last"})()
    with pytest.raises(ValueError, match="it must be in IPUOutfeedMode ALL"):
        in_replica(_body_with(accumulate_outfeed=True, outfeed_queue=last))


def test_interleaved_inference_overlap_is_s_and_g_10_fails_with_3_stages(isolated):
    """PT:217-275: G=10 with 3 stages in inference fails 'must be a multiple of 3'."""
    configure(ipus_per_replica=4)
    for schedule in (PipelineSchedule.Grouped, PipelineSchedule.Interleaved):
        with pytest.raises(FailedPreconditionError, match="must be a multiple of 3, but it is 10"):
            in_replica(lambda: pipeline([lambda x: x] * 3, 10, inputs=[1.0],
                                        outfeed_queue=ListOutfeed(),
                                        pipeline_schedule=schedule))


def test_shared_variable_on_two_ipus_is_refused(isolated):
    configure(ipus_per_replica=2)

    def body():
        w = Variable(np.ones(2), "shared")

        def f(x):
            return (x * w.value,), None

        def b(saved, d):
            return {w: np.ones(2)}, (d[0],)
        pipeline([Stage(f, b), Stage(f, b)], 4, inputs=[np.ones(2)],
                 outfeed_queue=ListOutfeed(),
                 optimizer_function=lambda x: OptimizerFunctionOutput(
                     GradientDescentOptimizer(0.1), x))
    with pytest.raises(ValueError, match="stages that share a Variable must be on the same IPU"):
        in_replica(body)


def test_pipeline_outside_a_replica_function_is_refused(isolated):
    configure(ipus_per_replica=2)
    with pytest.raises(ipu_node.NotInReplicaError, match="pipelining_ops.pipeline"):
        pipeline([lambda x: x, lambda x: x], 2, inputs=[1.0], outfeed_queue=ListOutfeed())


def _tree_mean(rows):
    def tree(rs):
        if len(rs) == 1:
            return rs[0]
        p = 1 << ((len(rs) - 1).bit_length() - 1)
        return tree(rs[:p]) + tree(rs[p:])
    return tree(rows) / rows[0].dtype.type(len(rows))


@pytest.mark.parametrize("replicas", [2, 4])
def test_o1_replicated_with_real_feeds_and_cross_replica_optimizer(isolated, replicas):
    """W = opt(W, mean_r acc_r) with acc_r over elements (rep*G + m)*R + r (reference §3 O1,
    §1.6); the losses come back from an IPUOutfeedQueue as [repeat*G, R] (a list of one)."""
    from collectives.optimizers import CrossReplicaOptimizer
    from collectives.strategies import IPUMultiReplicaStrategy
    from ipu_node.data import Dataset
    from ipu_node.ipu_compiler import compile as ipu_compile
    from ipu_node.ipu_infeed_queue import IPUInfeedQueue
    from ipu_node.ipu_outfeed_queue import IPUOutfeedQueue

    configure(ipus_per_replica=2, replicas=replicas)
    g, repeats = 4, 2
    weights = init_weights(5, sizes=(8, 16, 3))
    elements = make_elements(6, g * repeats * replicas)
    xs = np.stack([x for x, _ in elements])
    ys = np.stack([y for _, y in elements])
    infeed = IPUInfeedQueue(Dataset.from_tensor_slices((xs, ys)))
    outfeed = IPUOutfeedQueue()
    strategy = IPUMultiReplicaStrategy()
    holder = {}

    def body():
        variables = [Variable(w, f"W{i}") for i, w in enumerate(weights)]
        opt = CrossReplicaOptimizer(GradientDescentOptimizer(LR))
        pipeline(mlp_stages(variables), g, repeat_count=repeats, infeed_queue=infeed,
                 outfeed_queue=outfeed,
                 optimizer_function=lambda loss: OptimizerFunctionOutput(opt, loss))
        holder[int(__import__("collectives").replication_index())] = [v.value for v in variables]
    with strategy.scope():
        ipu_compile(body)
    losses = outfeed.dequeue()
    assert isinstance(losses, list) and losses[0].shape == (repeats * g, replicas)
    w = [x.copy() for x in weights]
    for rep in range(repeats):
        accs = []
        for r in range(replicas):
            mine = [elements[(rep * g + m) * replicas + r] for m in range(g)]
            for m, (x, y) in enumerate(mine):
                assert losses[0][rep * g + m, r] == grads_of(w, x, y)[0]
            accs.append(grad_sums(w, mine))
        w = [wi - np.float32(LR) * _tree_mean([a[i] for a in accs]) for i, wi in enumerate(w)]
    for r in range(replicas):
        for got, want in zip(holder[r], w):
            assert got.tobytes() == want.tobytes()
    report = last_report()
    wu = [s for s in report.steps if s.kind == "WU"]
    assert len(wu) == 2 * repeats and all(s.copy_s > 0 for s in wu)  # the all-reduce's time


def test_outfeed_shapes_through_an_ipu_outfeed_queue(isolated):
    """PT rows of reference §1.5 through the real queue: mask -> [[4]*8] (a list of one);
    accumulate_outfeed with outfeed_loss -> [8]."""
    from ipu_node.ipu_compiler import compile as ipu_compile
    from ipu_node.ipu_outfeed_queue import IPUOutfeedQueue
    from ipu_node.scopes import ipu_scope

    configure(ipus_per_replica=2)

    def run(**kw):
        out = IPUOutfeedQueue()

        def body():
            w = Variable(np.float32(1.0), "w")

            def s0(x):
                return (w.value * x,), None

            def last(x):
                return (x + np.float32(1.0), np.float32(4.0)), None
            stages = [Stage(s0, lambda s, d: ({w: np.float32(0)}, None)),
                      Stage(last, lambda s, d: ({}, (d[0],)))]
            pipeline(stages, 8, inputs=[np.float32(0.0)], outfeed_queue=out,
                     optimizer_function=lambda loss, x2: OptimizerFunctionOutput(
                         GradientDescentOptimizer(0.1), loss), **kw)
        with ipu_scope("/device:IPU:0"):
            ipu_compile(body)
        return out.dequeue()
    masked = run(outfeed_mask=[True, False])
    assert isinstance(masked, list) and np.array_equal(np.asarray(masked), np.full((1, 8), 4))
    np.testing.assert_array_equal(run(outfeed_loss=True, accumulate_outfeed=True), [8.0])
    np.testing.assert_array_equal(run(outfeed_loss=True), np.ones(8))


def test_a_stage_that_raises_leaves_no_stash_on_the_ipus(isolated):
    system = configure(ipus_per_replica=2)
    weights, elements = init_weights(1, sizes=(8, 16, 3)), make_elements(2, 4)

    def body():
        vs = [Variable(w) for w in weights]
        stages = mlp_stages(vs)

        def failing(saved, d):
            raise RuntimeError("stage 1 backward failed")
        stages[1] = Stage(stages[1].forward, failing)
        pipeline(stages, 4, infeed_queue=ListInfeed(elements), outfeed_queue=ListOutfeed(),
                 optimizer_function=lambda loss: OptimizerFunctionOutput(
                     GradientDescentOptimizer(0.1), loss))
    with pytest.raises(RuntimeError, match="stage 1 backward failed"):
        in_replica(body)
    for ipu in system.devices[0].ipus:
        assert not [n for n in system.memory[ipu.id].tensors() if "/stash/" in n]
