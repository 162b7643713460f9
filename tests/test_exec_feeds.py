"""IPUInfeedQueue and IPUOutfeedQueue: the oracles of execution-model.md §1.6 and §3 (O4,
O5) and the seeds' shape table [004:335-416], every error with its message, drain semantics."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from collectives import cross_replica_sum
from ipu_node import current_replica_context, ipu_compiler, loops, scopes
from ipu_node.data import Dataset
from ipu_node.errors import FailedPreconditionError, InvalidArgumentError, OutOfRangeError
from ipu_node.ipu_infeed_queue import IPUInfeedQueue
from ipu_node.ipu_outfeed_queue import IPUOutfeedMode, IPUOutfeedQueue

pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated:DeprecationWarning")


# ipu_compiler.compile needs a configured system: a 1-IPU one unless a test makes another
pytestmark = pytest.mark.usefixtures("one_ipu_system")


def on_ipu(fn, inputs=None):
    with scopes.ipu_scope("/device:IPU:0"):
        return ipu_compiler.compile(fn, inputs)


# ----- oracles ------------------------------------------------------------------------------

def test_rgt_two_replicas_cross_replica_sum_of_infeed(local_system):
    """RGT:172-220: range(3).repeat() over 2 replicas, v = cross_replica_sum(v + x), 5
    iterations: outfeed [5, 2, 2] holding 1, 4, 11, 23, 48 on both replicas."""
    strategy = local_system(2)
    dataset = Dataset.range(3).repeat().map(lambda x: np.full([2], x, np.float32))
    infeed, outfeed = IPUInfeedQueue(dataset), IPUOutfeedQueue()

    def body(v, x):
        v = cross_replica_sum(v + x)
        return v, outfeed.enqueue(v)

    with strategy.scope():
        result = ipu_compiler.compile(
            lambda: loops.repeat(5, body, [np.zeros([2], np.float32)], infeed))
    out = outfeed.dequeue()
    assert out.shape == (5, 2, 2) and out.dtype == np.float32
    expected = np.array([1, 4, 11, 23, 48], np.float32)
    np.testing.assert_array_equal(out, np.broadcast_to(expected[:, None, None], (5, 2, 2)))
    assert len(result) == 1
    np.testing.assert_array_equal(result[0], [48, 48])


def test_iot_last_mode_dict_of_images():
    """IOT:729-771: range(3) images, im2 = (im1 + 10) / 2, v += im1 + im2, 5 times, LAST:
    (31, 1, 5.5) broadcast to [4, 4]."""
    dataset = Dataset.range(3).repeat().map(lambda v: np.full([4, 4], v, np.float32))
    dataset = dataset.map(lambda im: (im, (im + 10.0) / 2.0))
    infeed = IPUInfeedQueue(dataset)
    outfeed = IPUOutfeedQueue(outfeed_mode=IPUOutfeedMode.LAST)

    def body(v, im1, im2):
        v = v + im1 + im2
        return v, outfeed.enqueue({"v": v, "image1": im1, "image2": im2})

    result = on_ipu(lambda: loops.repeat(5, body, [np.zeros([4, 4], np.float32)], infeed))
    np.testing.assert_array_equal(result[0], np.full([4, 4], 31.0))
    out = outfeed.dequeue()
    assert sorted(out) == ["image1", "image2", "v"]
    for key, value in (("v", 31.0), ("image1", 1.0), ("image2", 5.5)):
        assert out[key].shape == (4, 4) and out[key].dtype == np.float32
        np.testing.assert_array_equal(out[key], np.full([4, 4], value))


def test_last_scalar_with_one_replica_is_a_numpy_scalar():
    outfeed = IPUOutfeedQueue(outfeed_mode=IPUOutfeedMode.LAST)
    on_ipu(lambda: loops.repeat(3, lambda v: (v + 1.0, outfeed.enqueue(v + 1.0)), [0.0]))
    out = outfeed.dequeue()
    assert isinstance(out, np.float32) and out == 3.0


# ----- outfeed shapes (seed table [004:335-416]) -------------------------------------------

def _outfeed_run(strategy, mode, n, make_value):
    outfeed = IPUOutfeedQueue(outfeed_mode=mode)

    def body(v):
        v = v + 1
        return v, outfeed.enqueue(make_value(v))

    with strategy.scope():
        ipu_compiler.compile(lambda: loops.repeat(n, body, [np.ones([4, 4], np.float32)]))
    return outfeed.dequeue()


def _shapes(value):
    if isinstance(value, dict):
        return {k: _shapes(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_shapes(v) for v in value)
    return np.shape(value)


@pytest.mark.parametrize("mode, expected", [(IPUOutfeedMode.ALL, (20, 2, 4, 4)),
                                            (IPUOutfeedMode.LAST, (2, 4, 4))])
def test_single_tensor_two_replicas(local_system, mode, expected):
    out = _outfeed_run(local_system(2), mode, 20, lambda v: v)
    assert out.shape == expected
    np.testing.assert_array_equal(out[-1, 0] if mode is IPUOutfeedMode.ALL else out[0],
                                  np.full([4, 4], 21.0))


@pytest.mark.parametrize("mode, expected", [(IPUOutfeedMode.ALL, ((20, 4, 4), (20,))),
                                            (IPUOutfeedMode.LAST, ((4, 4), ()))])
def test_tuple_one_replica_has_no_replica_dimension(local_system, mode, expected):
    # seed quirk: the seed writes [20, 1] for the scalar tf.reduce_sum; it is [20]
    out = _outfeed_run(local_system(1), mode, 20, lambda v: (v, v.sum()))
    assert isinstance(out, tuple) and _shapes(out) == expected
    if mode is IPUOutfeedMode.ALL:
        np.testing.assert_array_equal(out[1], 16.0 * np.arange(2, 22))


@pytest.mark.parametrize("mode, expected", [
    (IPUOutfeedMode.ALL, {"x": (40, 8, 4, 4), "y": (40, 8)}),
    (IPUOutfeedMode.LAST, {"x": (8, 4, 4), "y": (8,)})])
def test_dict_eight_replicas(local_system, mode, expected):
    out = _outfeed_run(local_system(8), mode, 40, lambda v: {"x": v, "y": v.sum()})
    assert _shapes(out) == expected


def test_nested_list_structure_is_kept(local_system):
    out = _outfeed_run(local_system(2), IPUOutfeedMode.ALL, 3,
                       lambda v: [v[0], {"a": (v, v[0, 0])}])
    assert _shapes(out) == [(3, 2, 4), {"a": ((3, 2, 4, 4), (3, 2))}]
    np.testing.assert_array_equal(out[1]["a"][1][:, 1], [2.0, 3.0, 4.0])


def test_outfeed_holds_each_replicas_own_values(local_system):
    strategy = local_system(4)
    outfeed = IPUOutfeedQueue()

    def body(v):
        r = current_replica_context().replica_index
        return v + 1, outfeed.enqueue(np.float32(10 * r) + v)

    with strategy.scope():
        ipu_compiler.compile(lambda: loops.repeat(2, body, [np.float32(0)]))
    np.testing.assert_array_equal(outfeed.dequeue(),
                                  [[0, 10, 20, 30], [1, 11, 21, 31]])


# ----- infeed distribution (O5) ------------------------------------------------------------

@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_replica_r_gets_element_i_times_r_plus_r(local_system, replicas):
    strategy = local_system(replicas)
    infeed = IPUInfeedQueue(Dataset.range(100))
    outfeed = IPUOutfeedQueue()

    def body(x):
        return outfeed.enqueue((np.int64(current_replica_context().replica_index), x))

    for _ in range(2):  # the iteration count carries on across compile calls
        with strategy.scope():
            ipu_compiler.compile(lambda: loops.repeat(3, body, infeed_queue=infeed))
    rs, xs = outfeed.dequeue()
    rs, xs = rs.reshape(6, replicas), xs.reshape(6, replicas)
    for i in range(6):
        for r in range(replicas):
            assert rs[i, r] == r and xs[i, r] == i * replicas + r


def test_uneven_progress_of_replicas_does_not_change_their_elements(local_system):
    """Replica r runs r + 1 iterations; replica 3 runs first all alone for its last ones:
    the elements still follow i*R + r (assignment by index, not by arrival)."""
    strategy = local_system(4)
    infeed = IPUInfeedQueue(Dataset.range(64))
    seen: dict[int, list] = {}
    go = threading.Event()

    def step():
        r = current_replica_context().replica_index
        if r != 3:
            go.wait(timeout=30)
        got = []
        loops.repeat(r + 1, lambda x: got.append(int(x)), infeed_queue=infeed)
        seen[r] = got
        if r == 3:
            go.set()

    strategy.run(step)
    assert seen == {r: [i * 4 + r for i in range(r + 1)] for r in range(4)}


def test_infeed_outside_replicas_is_replica_0_of_1():
    infeed = IPUInfeedQueue([np.float32(v) for v in range(4)])
    got = []
    loops.repeat(4, lambda x: got.append(float(x)), infeed_queue=infeed)
    assert got == [0.0, 1.0, 2.0, 3.0]


# ----- errors --------------------------------------------------------------------------------

def test_shape_not_fully_defined():
    with pytest.raises(ValueError, match=r"^Output shape \(None,\) is not fully defined. If "
                       r"using tf.Dataset.batch, set `drop_remainder=True`.$"):
        IPUInfeedQueue(Dataset.range(10).batch(3))
    IPUInfeedQueue(Dataset.range(10).batch(3, drop_remainder=True))


def test_initializer_only_once():
    infeed = IPUInfeedQueue(Dataset.range(3))
    infeed.initializer
    with pytest.raises(ValueError, match="^The IPUInfeedQueue `initializer` function can only "
                       "be accessed once.$"):
        infeed.initializer


def test_zero_size_dimensions():
    with pytest.raises(InvalidArgumentError, match="Detected an input tensor to an infeed "
                       "queue with a dimension of size 0. Please remove it from the inputs."):
        IPUInfeedQueue(Dataset.from_tensor_slices(np.zeros([3, 0, 2])))
    outfeed = IPUOutfeedQueue()
    with pytest.raises(InvalidArgumentError, match="outfeed queue with a dimension of size 0"):
        outfeed.enqueue(np.zeros([2, 0]))


def test_dataset_that_runs_dry_names_the_feed_and_the_iteration():
    infeed = IPUInfeedQueue(Dataset.range(3), feed_name="train")
    with pytest.raises(OutOfRangeError, match=r"IPUInfeedQueue 'train' ran out of data: replica "
                       r"0 of 1 needs element 3 at iteration 3, but the dataset ended after 3 "
                       r"elements"):
        loops.repeat(5, lambda x: None, infeed_queue=infeed)
    with pytest.raises(OutOfRangeError, match="at iteration 3"):  # and again: no hang
        loops.repeat(1, lambda x: None, infeed_queue=infeed)


def test_dry_dataset_under_a_collective_fails_fast_instead_of_hanging(local_system):
    """Replica 1 runs dry at iteration 2 while replica 0 waits for it in cross_replica_sum."""
    strategy = local_system(2)
    infeed = IPUInfeedQueue(Dataset.range(5).map(np.float32))
    with strategy.scope(), pytest.raises(OutOfRangeError, match="replica 1 of 2 needs element "
                                         "5 at iteration 2"):
        ipu_compiler.compile(lambda: loops.repeat(
            3, lambda v, x: cross_replica_sum(v + x), [np.float32(0)], infeed))


def test_enqueue_twice_in_one_iteration():
    outfeed = IPUOutfeedQueue()

    def body(v):
        outfeed.enqueue(v)
        return v, outfeed.enqueue(v)

    with pytest.raises(ValueError, match="^An outfeed can only be enqueued once.$"):
        loops.repeat(2, body, [1.0])


def test_dequeue_before_enqueue_and_last_before_any_value():
    for mode in IPUOutfeedMode:
        with pytest.raises(ValueError, match="^Trying to dequeue an outfeed which has not "
                           "been enqueued.$"):
            IPUOutfeedQueue(outfeed_mode=mode).dequeue()
    last = IPUOutfeedQueue(outfeed_mode=IPUOutfeedMode.LAST)
    loops.repeat(2, lambda v: (v, last.enqueue(v)), [1.0])
    assert last.dequeue() == 1.0
    with pytest.raises(FailedPreconditionError, match="^Trying to get the last value from an "
                       "outfeed queue before it was executed."):
        last.dequeue()


def test_constructor_arguments_and_deprecated_ones():
    with pytest.warns(DeprecationWarning, match="feed_name"):
        infeed = IPUInfeedQueue(Dataset.range(2), feed_name="f", replication_factor=2,
                                data_to_prefetch=1)
    assert infeed.feed_name == "f" and infeed.number_of_tuple_elements == 1
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        IPUInfeedQueue(Dataset.range(2), bogus=1)
    with pytest.raises(TypeError, match="device_ordinal must be an integer"):
        IPUInfeedQueue(Dataset.range(2), "feed")  # old positional feed_name
    with pytest.raises(ValueError, match="prefetch_depth must be greater than zero, but it is 0"):
        IPUInfeedQueue(Dataset.range(2), prefetch_depth=0)
    with pytest.raises(ValueError, match="prefetch_depth must be less than 256"):
        IPUInfeedQueue(Dataset.range(2), prefetch_depth=256)
    with pytest.raises(ValueError, match="get_next"):
        infeed.get_next()
    with pytest.warns(DeprecationWarning, match="io_batch_size"):
        IPUOutfeedQueue(feed_name="o", io_batch_size=4, replication_factor=2)
    with pytest.raises(ValueError, match="Expected `outfeed_mode` value to be of"):
        IPUOutfeedQueue(outfeed_mode="all")
    assert IPUOutfeedMode.LAST.value == "get_last"
    dict_feed = IPUInfeedQueue(Dataset.from_tensor_slices({"a": np.zeros(2), "b": np.zeros(2)}))
    assert dict_feed.number_of_tuple_elements == 2 and not dict_feed.dequeued


def test_element_not_matching_the_first_shape_raises():
    infeed = IPUInfeedQueue([np.zeros(2), np.zeros(3)], feed_name="ragged")
    with pytest.raises(ValueError, match=r"'ragged': element 1, component 0 has shape \(3,\)"):
        loops.repeat(2, lambda x: None, infeed_queue=infeed)


def test_enqueue_of_another_structure_raises():
    outfeed = IPUOutfeedQueue()
    outfeed.enqueue((np.zeros(2), np.zeros(1)))
    with pytest.raises(ValueError, match=r"enqueued \(\*,\), but the first enqueue was"):
        outfeed.enqueue((np.zeros(2),))
    with pytest.raises(ValueError, match="keys in the outfeed dictionary to be strings"):
        IPUOutfeedQueue().enqueue({1: np.zeros(1)})


# ----- drain semantics ---------------------------------------------------------------------

def test_dequeue_drains_all_mode():
    outfeed = IPUOutfeedQueue()
    on_ipu(lambda: loops.repeat(4, lambda v: (v + 1, outfeed.enqueue(v)), [np.float32(0)]))
    np.testing.assert_array_equal(outfeed.dequeue(), [0, 1, 2, 3])
    again = outfeed.dequeue()
    assert again.shape == (0,) and again.dtype == np.float32


def test_iterating_the_outfeed_drains_it():
    """IOT:1666-1717: 10 elements, then none on a second pass."""
    outfeed = IPUOutfeedQueue()
    on_ipu(lambda: loops.repeat(10, lambda v: (v + 1, outfeed.enqueue(v)), [np.int32(0)]))
    assert [int(v) for v in outfeed] == list(range(10))
    assert list(outfeed) == []
