"""A forward pass's thread state and a replica's random numbers: every random function draws
from the replica's generator exactly what it drew from PyTorch's default generator set to the
replica's state (the way before: a swap under a process-wide lock), with no lock and from
concurrent threads; a :class:`poptorch._forward_pass.ForwardPass` steps in and out of its
thread state and checks that the mode on top is its own."""

import threading

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import poptorch
from poptorch._forward_pass import ForwardPass, current_pass
from poptorch._replica_rng import ReplicaRNG
from poptorch._tracing import RANDOM_FUNCTIONS, Trace


def _x():
    return torch.linspace(-2, 2, 2 * 3 * 4 * 5).reshape(2, 3, 4, 5)


def _calls():
    """(name, func, args, kwargs) of every random function, drawing."""
    x, p = _x(), torch.full((4, 5), 0.3)
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]])
    T = torch.Tensor
    calls = [
        ("F.dropout", F.dropout, (x, 0.4, True), {}),
        ("F.dropout1d", F.dropout1d, (x[0], 0.4, True), {}),
        ("F.dropout2d", F.dropout2d, (x, 0.4, True), {}),
        ("F.dropout3d", F.dropout3d, (x, 0.4, True), {}),
        ("F.alpha_dropout", F.alpha_dropout, (x, 0.4, True), {}),
        ("F.feature_alpha_dropout", F.feature_alpha_dropout, (x, 0.4, True), {}),
        ("F.rrelu", F.rrelu, (x,), {"training": True}),
        ("F.gumbel_softmax", F.gumbel_softmax, (x,), {"tau": 0.5}),
        ("torch.rand", torch.rand, (3, 4), {}),
        ("torch.randn", torch.randn, (3, 4), {}),
        ("torch.randint", torch.randint, (0, 9, (3, 4)), {}),
        ("torch.randperm", torch.randperm, (17,), {}),
        ("torch.rand_like", torch.rand_like, (x,), {}),
        ("torch.randn_like", torch.randn_like, (x,), {}),
        ("torch.randint_like", torch.randint_like, (x, 0, 9), {}),
        ("torch.bernoulli", torch.bernoulli, (p,), {}),
        ("torch.multinomial", torch.multinomial, (probs, 3), {"replacement": True}),
        ("torch.normal", torch.normal, (x, 2.0), {}),
        ("torch.poisson", torch.poisson, (x.abs(),), {}),
        ("torch.dropout", torch.dropout, (x, 0.4, True), {}),
        ("torch.rrelu", torch.rrelu, (x,), {"training": True}),
        ("Tensor.bernoulli", T.bernoulli, (p,), {}),
        ("Tensor.multinomial", T.multinomial, (probs, 2), {}),
    ]
    for name in ("bernoulli_", "uniform_", "normal_", "random_", "exponential_", "geometric_",
                 "cauchy_", "log_normal_"):
        arg = (0.3,) if name in ("bernoulli_", "geometric_") else ()
        calls.append((f"Tensor.{name}", getattr(T, name), (torch.empty(4, 5), *arg), {}))
    return calls


def test_every_random_function_is_tested():
    assert {c[1] for c in _calls()} == set(RANDOM_FUNCTIONS)


def _clone(values):
    return tuple(v.clone() if isinstance(v, torch.Tensor) else v for v in values)


@pytest.mark.parametrize("call", _calls(), ids=lambda c: c[0])
def test_a_random_function_draws_what_the_swapped_default_generator_drew(call):
    _, func, args, kwargs = call
    rng = ReplicaRNG(7, 3)
    state = rng.state.clone()
    saved = torch.get_rng_state()
    torch.set_rng_state(state)  # the way before (without its lock)
    want = func(*_clone(args), **kwargs)
    want_state = torch.get_rng_state()
    torch.set_rng_state(saved)
    got = rng.call(func, _clone(args), kwargs)
    assert torch.equal(got, want)
    assert torch.equal(rng.state, want_state)  # the stream moved on by the same draws
    assert torch.equal(torch.get_rng_state(), saved)  # the default generator is untouched


@pytest.mark.parametrize("args,kwargs", [
    ((0.4, True), {}), ((), {"p": 0.3, "training": True}), ((0.5,), {}),
    ((0.4, True, True), {}), ((1.0, True), {}), ((0.0, True), {}), ((0.4, False), {}),
    ((0, True), {})], ids=["positional", "keywords", "default-training", "inplace", "p=1",
                           "p=0", "eval", "int-p"])
def test_dropout_values_and_gradients_are_atens(args, kwargs):
    """F.dropout computed with the replica's generator (ipupod's own path for the common
    case, the dispatch mode for the rest) against ATen's own with the default generator set
    to the same state: the same values, gradients and stream."""
    def run(call):
        x = torch.linspace(-1, 1, 64).reshape(8, 8).requires_grad_()
        y = x * 2  # (a non-leaf, so that an in-place dropout may write it)
        out = call(y)
        out.backward(torch.arange(64.0).reshape(8, 8))
        return out.detach(), x.grad
    rng = ReplicaRNG(3, 1)
    state, saved = rng.state.clone(), torch.get_rng_state()
    torch.set_rng_state(state)
    want = run(lambda y: F.dropout(y, *args, **kwargs))
    want_state = torch.get_rng_state()
    torch.set_rng_state(saved)
    got = run(lambda y: rng.call(F.dropout, (y, *args), kwargs))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(rng.state, want_state)


def test_a_generator_given_by_the_program_is_used_as_given():
    rng, mine = ReplicaRNG(0, 0), torch.Generator().manual_seed(5)
    before = rng.state.clone()
    got = rng.call(torch.rand, (4,), {"generator": mine})
    assert torch.equal(got, torch.rand(4, generator=torch.Generator().manual_seed(5)))
    assert torch.equal(rng.state, before)


def test_replica_threads_draw_their_own_streams_concurrently():
    """Four threads, each drawing from its replica's generator at once, get what each
    replica draws alone (no lock serialises them, no draw lands in another stream)."""
    def draws(rng):
        out = []
        for _ in range(50):
            out.append(rng.call(F.dropout, (torch.ones(64), 0.5, True), {}))
            out.append(rng.call(torch.randn, (8,), {}))
            out.append(rng.call(F.rrelu, (torch.ones(16),), {"training": True}))
        return torch.cat(out)

    alone = [draws(ReplicaRNG(1, r)) for r in range(4)]
    results, start = [None] * 4, threading.Barrier(4)

    def replica(r):
        rng = ReplicaRNG(1, r)
        start.wait()
        results[r] = draws(rng)
    threads = [threading.Thread(target=replica, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(torch.equal(a, b) for a, b in zip(alone, results))


def _top_mode():
    depth = torch._C._len_torch_function_stack()
    return torch._C._get_function_stack_at(depth - 1) if depth else None


def test_a_pass_steps_out_of_its_state_and_back_in():
    """Pause gives the thread back as the pass found it (grad mode, mode stack, current
    pass); resume brings back the pass's own, with the grad mode its code left; the end
    gives the thread back as it was at the last resume."""
    trace = Trace(ReplicaRNG(0, 0))
    with torch.no_grad():
        forward = ForwardPass(trace, grad=True)
        with forward:
            assert torch.is_grad_enabled() and current_pass() is forward
            assert _top_mode() is trace
            torch.set_grad_enabled(False)  # the model's own no_grad, open at the pause
            forward.pause()
            assert not torch.is_grad_enabled() and current_pass() is None
            assert _top_mode() is None
            torch.set_grad_enabled(True)  # the scheduler's
            forward.resume()
            assert not torch.is_grad_enabled() and _top_mode() is trace
            torch.set_grad_enabled(True)
        # the end gives the thread back as it was where the pass last stepped in
        assert torch.is_grad_enabled() and current_pass() is None
        assert _top_mode() is None


def test_a_pause_under_a_mode_that_is_not_its_own_names_it():
    class Other(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    forward = ForwardPass(Trace(), grad=False)
    with forward:
        with Other():
            with pytest.raises(poptorch.Error, match="Other"):
                forward.pause()
        forward.pause()
        forward.resume()
    assert _top_mode() is None and current_pass() is None


def test_a_pass_that_intercepts_nothing_names_a_mode_left_open_at_its_pause():
    """A pipelined pass that follows its blocks without intercepting ops (inference, or
    training cut at the modules' inputs) is not on the mode stack, yet a mode entered inside
    a block and open at the pause would leak into the other passes: it is named."""
    from poptorch.pipelining._stage_trace import StagePlan, StageTrace, Segment

    class Other(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    plan = StagePlan([Segment(0, 0), Segment(1, 1)], {"b": 1}, sharded=False)
    trace = StageTrace(None, poptorch.PipelinedExecution(), plan, intercept=False)
    assert not trace.intercept
    forward = ForwardPass(trace, grad=False)
    with forward:
        other = Other()
        other.__enter__()
        with pytest.raises(poptorch.Error, match="Other"):
            forward.pause()
        other.__exit__(None, None, None)
        forward.pause()
        forward.resume()
    assert _top_mode() is None and current_pass() is None
