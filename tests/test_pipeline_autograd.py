"""Stage.autograd (extra ipupod[autodiff]): autograd's backward agrees with the hand-written
one, labels pass through, and every schedule gives the same bits."""

import autograd.numpy as anp
import numpy as np

from ipu_node import Variable
from ipu_node.optimizers import GradientDescentOptimizer
from ipu_node.pipelining_ops import (OptimizerFunctionOutput, PipelineSchedule, Stage,
                                     pipeline)
from tests.hw_fixtures import isolated  # noqa: F401
from tests.pipeline_models import (ListInfeed, ListOutfeed, configure, in_replica,
                                   init_weights, make_elements, mlp_stages)


def _hidden(params, h, y):
    return anp.maximum(h @ params[0], 0), y


def _loss(params, h, y):
    logits = h @ params[0]
    logits = logits - anp.max(logits, axis=1, keepdims=True)
    log_p = logits - anp.log(anp.sum(anp.exp(logits), axis=1, keepdims=True))
    return -anp.mean(log_p[np.arange(len(y)), y])


def _train(weights, elements, schedule, auto):
    def body():
        vs = [Variable(w) for w in weights]
        stages = ([Stage.autograd(_hidden, [vs[0]]), Stage.autograd(_loss, [vs[1]])] if auto
                  else mlp_stages(vs))
        opt = GradientDescentOptimizer(0.05)
        out = ListOutfeed()
        pipeline(stages, 4, repeat_count=2, infeed_queue=ListInfeed(elements),
                 outfeed_queue=out, pipeline_schedule=schedule,
                 optimizer_function=lambda loss: OptimizerFunctionOutput(opt, loss))
        return [v.value for v in vs], [float(item[0]) for item in out.items]
    return in_replica(body)


def test_autograd_stages_train_like_the_hand_written_ones(isolated):
    configure(ipus_per_replica=2)
    weights, elements = init_weights(1, sizes=(8, 16, 3)), make_elements(2, 8)
    hand = _train(weights, elements, PipelineSchedule.Grouped, auto=False)
    auto = {s: _train(weights, elements, s, auto=True) for s in PipelineSchedule}
    for w_auto, w_hand in zip(auto[PipelineSchedule.Grouped][0], hand[0]):
        np.testing.assert_allclose(w_auto, w_hand, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(auto[PipelineSchedule.Grouped][1], hand[1], rtol=1e-5)
    for result in auto.values():
        assert all(a.tobytes() == b.tobytes()
                   for a, b in zip(result[0], auto[PipelineSchedule.Grouped][0]))
