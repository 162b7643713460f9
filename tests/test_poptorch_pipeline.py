"""PopTorch models over several IPUs (issue 23): the annotations and their errors (poptorch
reference §7, oracles 9 and 10), the schedule's order and stash depths against ipu_node's
closed forms (the counts, memory and reports: test_poptorch_pipeline_counts.py)."""

import pytest
import torch

import poptorch
from ipu_node.pipelining.schedules import PipelineSchedule, schedule_steps
from tests.poptorch_chain import Chain, F, annotate, data, training


# -- annotations and their errors ---------------------------------------------------------

def test_begin_block_rules_and_remove_blocks():
    layer = torch.nn.Linear(2, 2)
    assert poptorch.BeginBlock(layer, "A", ipu_id=1) is layer
    with pytest.raises(poptorch.Error, match="module has already been assigned to a block."):
        poptorch.BeginBlock(layer)
    with pytest.raises(poptorch.Error, match="module is not an instance of torch.nn.Module or "
                                             "function."):
        poptorch.BeginBlock(3)
    wrapped = poptorch.BeginBlock(lambda t: t * 2, "B", ipu_id=1)
    assert isinstance(wrapped, torch.nn.Module) and torch.equal(wrapped(torch.ones(1)),
                                                                torch.full((1,), 2.0))
    poptorch.removeBlocks(layer)
    assert poptorch.BeginBlock(layer) is layer  # no longer in a block
    with poptorch.Block("outside", ipu_id=3):  # outside a PopTorch model: nothing happens
        assert torch.equal(layer(torch.zeros(1, 2)), layer.bias.reshape(1, 2))


def test_stage_and_strategy_rules():
    with pytest.raises(AssertionError, match="Block IDs are supposed to be strings but got"):
        poptorch.Stage("A", 1)
    with pytest.raises(AssertionError, match="A associated with more than one stage"):
        poptorch.PipelinedExecution("A", poptorch.Stage("B", "A"))
    strategy = poptorch.PipelinedExecution("A", ["B", "C"], poptorch.Stage("D").ipu(3))
    assert strategy.stage("C").blocks == ["B", "C"]
    with pytest.raises(AssertionError, match="Unknown block X"):
        strategy.stage("X")
    with pytest.raises(AssertionError):
        poptorch.Options().setExecutionStrategy("pipelined")
    opts = poptorch.Options()
    poptorch.trainingModel(Chain(), opts)
    with pytest.raises(AttributeError, match="Can't modify frozen Options"):
        opts.setExecutionStrategy(poptorch.ShardedExecution())


def test_unknown_blocks_and_blocks_without_ipu_fail_at_compile():
    x, y = data(4)
    net = annotate(Chain(2), [0, 1])
    model = training(net, G=3, strategy=poptorch.PipelinedExecution("L0", "Other"))
    with pytest.raises(AssertionError, match=r"Unknown Block 'L1' list of expected Blocks: "
                                             r"\['L0', 'Other'\]"):
        model(x[:3], y[:3])
    net = Chain(2)
    poptorch.BeginBlock(net.layers[1], "nowhere")
    with pytest.raises(AssertionError, match="poptorch.AutoStage.SameAsIpu was selected but no "
                                             "IPU was specified for block nowhere"):
        training(net)(x[:1], y[:1])


def test_a_pipeline_may_not_go_back_to_an_earlier_ipu_but_shards_may():
    x, y = data(3)
    with pytest.raises(poptorch.Error, match="Block 'L1' is in pipeline stage 0, after stage 1"):
        training(annotate(Chain(2), [1, 0]), G=3, autoRoundNumIPUs=True)(x, y)
    model = training(annotate(Chain(3), [0, 1, 0]), G=3, strategy=poptorch.ShardedExecution())
    model(x, y)
    report = model.modelReport()
    assert [s.ipu for s in report.stages] == [0, 1, 0] and report.schedule == "ShardedExecution"


def test_auto_increment_and_auto_ids():
    class Auto(Chain):
        def forward(self, x, y):
            poptorch.Block.useAutoId()
            with poptorch.Block(ipu_id=0):
                x = torch.tanh(self.layers[0](x))
            with poptorch.Block(ipu_id=1):
                x = torch.tanh(self.layers[1](x))
            with poptorch.Block(ipu_id=1):
                out = self.head(x)
            return out, F.cross_entropy(out, y)

    x, y = data(5)
    model = training(Auto(2), G=5, strategy=poptorch.PipelinedExecution(
        poptorch.AutoStage.AutoIncrement))
    model(x, y)
    report = model.modelReport()
    assert [s.blocks for s in report.stages] == [("0",), ("1",), ("2",)]
    assert [s.ipu for s in report.stages] == [0, 1, 1]
    model(x, y)  # the same automatic ids on every call


def test_oracle_9_pipelined_training_needs_2n_minus_1_micro_batches():
    x, y = data(7)
    for G in (4, 5):
        with pytest.raises(poptorch.Error, match=(
                r"poptorch.Options\(\).Training.gradientAccumulation must be greater than or "
                r"equal to the number of pipeline stages \(7\) when using "
                r"poptorch.PipelinedExecution. Please note that a model with 4 pipeline "
                r"stages in PopTorch will have an additional 3 stages when training.")):
            training(annotate(Chain(4), [0, 1, 2, 3]), G=G).compile(x[:G], y[:G])
    model = training(annotate(Chain(4), [0, 1, 2, 3]), G=7)
    model.compile(x, y)
    assert model.isCompiled()
    model.destroy()


def test_oracle_10_pipelined_inference_needs_n_device_iterations():
    def inference(di, strategy=None):
        opts = poptorch.Options().deviceIterations(di)
        if strategy is not None:
            opts.setExecutionStrategy(strategy)
        net = annotate(Chain(4), [0, 1, 2, 3])
        return poptorch.inferenceModel(net, opts)

    x, y = data(4)
    with pytest.raises(poptorch.Error, match=(
            r"poptorch.Options\(\).deviceIterations must be greater than or equal to the "
            r"number of pipeline stages \(4\) when using PopTorch.PipelinedExecution.")):
        inference(2)(x[:2], y[:2])
    inference(4)(x, y)
    inference(2, poptorch.ShardedExecution())(x[:2], y[:2])
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    with pytest.raises(poptorch.Error, match=r"\(1\) when running a poptorch.inferenceModel\(\)."
                                             r"$"):
        poptorch.inferenceModel(Chain(), opts.setExecutionStrategy(poptorch.ShardedExecution()))


def test_ipu_counts_round_to_powers_of_two_and_blocks_need_the_replicas_ipus():
    x, y = data(5)
    with pytest.raises(poptorch.Error, match="The model specifies the use of 3 IPUs, however "
                                             "PopTorch must reserve a minimum of 4"):
        training(annotate(Chain(3), [0, 1, 2]), G=5)(x, y)
    model = training(annotate(Chain(3), [0, 1, 2]), G=5, autoRoundNumIPUs=True)
    model(x, y)
    assert len(model._device.replica_ipus[0]) == 4
    import popdist.poptorch
    opts = popdist.poptorch.Options(ipus_per_replica=2)
    opts.Training.gradientAccumulation(5)
    with pytest.raises(poptorch.Error, match=r"places block 'L2' on IPU 2, but each replica has "
                                             r"2 IPU\(s\)"):
        poptorch.trainingModel(annotate(Chain(3), [0, 1, 2]), opts)(x, y)


# -- the schedule ---------------------------------------------------------------------------

def _executed(net: Chain, model, x, y, G: int):
    """The forward and backward passes as they ran: (kind, stage, micro-batch) (the
    micro-batch is known for stage 0's forward, from its input)."""
    seen, calls = [], []
    micro = {float(x[m * (len(x) // G)][0]): m for m in range(G)}
    for i, layer in enumerate(net.layers):
        layer.weight.register_hook(lambda g, i=i: seen.append(("B", i, None)))
        layer.register_forward_hook(lambda mod, inputs, out, i=i: calls.append(
            ("F", i, micro.get(float(inputs[0].detach().reshape(-1)[0])))))
    model(x, y)
    return calls, seen


@pytest.mark.parametrize("strategy", [None, poptorch.ShardedExecution()])
def test_passes_run_in_the_schedules_exact_order(strategy):
    """Layer i is stage i: its forward runs micro-batch m in the schedule's order
    (PopART's Grouped with the fused last stage: t = m + k; Sharded: t = m(2N-1) + k)."""
    G, N = 6, 3
    x, y = data(G * 2)
    net = annotate(Chain(N), [0, 1, 2])
    model = training(net, G=G, strategy=strategy, autoRoundNumIPUs=True)
    model.compile(x, y)
    schedule = PipelineSchedule.Sequential if strategy else PipelineSchedule.Grouped
    expected = schedule_steps(schedule, N, G, training=True, fused_last=True)
    fwd_expected = [("F", p.stage, p.micro_batch) for step in expected for p in step
                    if p.kind == "F"]
    bwd_expected = [("B", p.stage, None) for step in expected for p in step if p.kind == "B"]
    forwards, backwards = _executed(net, model, x, y, G)
    micro_of_stage0 = [m for _, s, m in forwards if s == 0]
    assert micro_of_stage0 == list(range(G))
    # the stages' forward passes interleave as the schedule says (micro-batches of later
    # stages follow from the stage-0 inputs they were given)
    assert [s for _, s, _ in forwards] == [s for _, s, _ in fwd_expected]
    assert backwards == bwd_expected
    report = model.modelReport()
    depths = [s.stash_depth for s in report.stages]
    assert depths == ([1] * N if strategy else [2 * (N - 1 - s) for s in range(N - 1)] + [1])


def test_an_error_in_a_later_stage_cancels_the_paused_forward_passes():
    """Micro-batch 1 fails in the last stage while micro-batches 2 and 3 are paused in
    earlier ones: the call raises the model's error, the paused passes are unwound (their
    blocks no longer current in this thread), and the next call runs every micro-batch."""
    from poptorch.pipelining._blocks import current_forward
    G, N = 6, 3
    x, y = data(G * 2)
    net = annotate(Chain(N), [0, 1, 2])
    model = training(net, G=G, autoRoundNumIPUs=True)
    model.compile(x, y)
    last, runs, failing = net.layers[N - 1], [], [True]

    def fail_once(module, inputs):
        runs.append(1)
        if failing[0] and len(runs) == 2:
            raise RuntimeError("stage 2 failed")
    handle = last.register_forward_pre_hook(fail_once)
    with pytest.raises(RuntimeError, match="stage 2 failed"):
        model(x, y)
    assert current_forward() is None and torch.is_grad_enabled()
    failing[0] = False
    runs.clear()
    model(x, y)
    assert len(runs) == G
    handle.remove()
    model.destroy()


class _Skip(torch.nn.Module):
    """Three blocks; with ``stray`` the second block's output also skips the third block's
    module (a tensor crossing outside the input of the module that begins its stage)."""

    def __init__(self, stray: bool):
        super().__init__()
        torch.manual_seed(0)
        self.l1, self.l2, self.l3, self.head = (torch.nn.Linear(8, 8) for _ in range(4))
        self.stray = stray

    def forward(self, x, y):
        h = torch.tanh(self.l1(x))
        z = torch.tanh(self.l2(h))
        out = self.head(self.l3(z) + (h if self.stray else 0))
        return out, F.cross_entropy(out, y)


@pytest.mark.parametrize("stray", [False, True])
def test_stages_cut_at_their_modules_inputs_intercept_no_op_and_train_bit_for_bit(stray):
    """Where every tensor crossing stages is an input of the module that begins its stage,
    a training forward runs with no TorchFunctionMode (the BeginBlock hooks cut the graphs);
    where one crosses elsewhere, every op is intercepted. Either way the weights equal the
    unsplit model's, bit for bit."""
    G, di = 6, 2
    x, y = data(G * di * 4)
    stacks = []
    weights = []
    for blocks in (True, False):
        net = _Skip(stray)
        if blocks:
            poptorch.BeginBlock(net.l2, "b", ipu_id=1)
            poptorch.BeginBlock(net.l3, "c", ipu_id=2)
            net.l3.register_forward_pre_hook(
                lambda m, i: stacks.append(torch._C._len_torch_function_stack()))
        model = training(net, G=G, di=di, autoRoundNumIPUs=True)
        for _ in range(2):
            model(x, y)
        model.copyWeightsToHost()
        weights.append([p.detach().clone() for p in net.parameters()])
        if blocks:
            assert model._executable.stage.at_modules is not stray
        model.destroy()
    assert all(torch.equal(a, b) for a, b in zip(*weights))
    # compile's counting pass intercepts every op; the calls' passes too where it crossed
    assert stacks[0] >= 1 and set(stacks[1:]) == ({1} if stray else {0})
