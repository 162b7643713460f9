"""ipu_node.data.Dataset: the tf.data stand-in (slices, batch, repeat, map, shuffle, take,
shard, element specs, re-iteration)."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_node.data import (INFINITE_CARDINALITY, Dataset, TensorSpec, UNKNOWN_CARDINALITY,
                           as_dataset)
from ipu_node.errors import InvalidArgumentError


def values(ds, n=None):
    out = []
    for i, e in enumerate(ds):
        if n is not None and i == n:
            break
        out.append(e)
    return out


def test_from_tensor_slices_nested_structure_and_spec():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.array([0, 1, 2], np.int32)
    ds = Dataset.from_tensor_slices(({"x": x}, y))
    assert ds.element_spec == ({"x": TensorSpec((4,), np.dtype(np.float32))},
                               TensorSpec((), np.dtype(np.int32)))
    got = values(ds)
    assert len(got) == 3 and ds.cardinality() == 3
    np.testing.assert_array_equal(got[1][0]["x"], x[1])
    assert got[2][1] == 2 and got[2][1].dtype == np.int32
    assert values(ds)[0][1] == 0  # re-iterable: starts over


def test_from_tensor_slices_treats_a_list_as_one_tensor():
    ds = Dataset.from_tensor_slices([[1.0, 2.0], [3.0, 4.0]])
    assert ds.element_spec == TensorSpec((2,), np.dtype(np.float64))
    np.testing.assert_array_equal(values(ds)[1], [3.0, 4.0])


def test_from_tensor_slices_errors():
    with pytest.raises(ValueError, match="same first dimension"):
        Dataset.from_tensor_slices((np.zeros(3), np.zeros(4)))
    with pytest.raises(ValueError, match="scalar"):
        Dataset.from_tensor_slices(np.float32(1))


def test_batch_spec_unknown_without_drop_remainder():
    ds = Dataset.range(10)
    loose, tight = ds.batch(4), ds.batch(4, drop_remainder=True)
    assert loose.element_spec == TensorSpec((None,), np.dtype(np.int64))
    assert tight.element_spec == TensorSpec((4,), np.dtype(np.int64))
    assert [list(b) for b in loose] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [list(b) for b in tight] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert (loose.cardinality(), tight.cardinality()) == (3, 2)


def test_batch_of_different_shapes_raises():
    ds = as_dataset([np.zeros(2), np.zeros(3)]).batch(2)
    with pytest.raises(InvalidArgumentError, match="Cannot batch tensors with different "
                       r"shapes in component 0. First element had shape \[2\] and element 1 "
                       r"had shape \[3\]."):
        values(ds)


def test_repeat_take_skip_and_cardinality():
    ds = Dataset.range(3)
    assert [int(v) for v in ds.repeat(2)] == [0, 1, 2, 0, 1, 2]
    assert [int(v) for v in values(ds.repeat(), 7)] == [0, 1, 2, 0, 1, 2, 0]
    assert ds.repeat().cardinality() == INFINITE_CARDINALITY
    assert [int(v) for v in ds.repeat().take(4)] == [0, 1, 2, 0]
    assert ds.repeat().take(4).cardinality() == 4
    assert [int(v) for v in ds.skip(1)] == [1, 2]
    assert values(Dataset.range(0).repeat()) == []  # an empty dataset never loops for ever


def test_map_unpacks_tuples_and_keeps_unknown_batch_dimension():
    ds = Dataset.from_tensor_slices((np.arange(4.0), np.arange(4.0) * 10))
    summed = ds.map(lambda a, b: {"s": a + b})
    assert [float(e["s"]) for e in summed] == [0.0, 11.0, 22.0, 33.0]
    assert summed.element_spec == {"s": TensorSpec((), np.dtype(np.float64))}
    batched = Dataset.range(5).batch(2).map(lambda b: (b * 2, b.sum()))
    assert batched.element_spec == (TensorSpec((None,), np.dtype(np.int64)),
                                    TensorSpec((), np.dtype(np.int64)))
    assert Dataset.range(2).map(lambda v: [v, v]).element_spec == (
        TensorSpec((), np.dtype(np.int64)),) * 2  # a list becomes a tuple


def test_shuffle_is_deterministic_with_a_seed_and_a_permutation():
    ds = Dataset.range(20).shuffle(5, seed=7)
    first = [int(v) for v in Dataset.range(20).shuffle(5, seed=7)]
    assert [int(v) for v in ds] == first
    assert sorted(first) == list(range(20)) and first != list(range(20))
    # tf.data's buffer: the first element comes from the first buffer_size elements
    assert first[0] < 5
    epochs = [int(v) for v in Dataset.range(20).shuffle(5, seed=7).repeat(2)]
    assert epochs[:20] == first and epochs[20:] != first  # reshuffled each iteration
    fixed = Dataset.range(20).shuffle(5, seed=7, reshuffle_each_iteration=False).repeat(2)
    fixed = [int(v) for v in fixed]
    assert fixed[:20] == fixed[20:] == first
    with pytest.raises(ValueError, match="buffer_size must be a positive integer"):
        Dataset.range(3).shuffle(0)


def test_map_reading_its_spec_does_not_change_a_shuffled_order():
    plain = [int(v) for v in Dataset.range(20).shuffle(8, seed=2)]
    mapped = Dataset.range(20).shuffle(8, seed=2).map(lambda v: v * 10)
    assert mapped.element_spec == TensorSpec((), np.dtype(np.int64))  # reads one element
    assert [int(v) // 10 for v in mapped] == plain


def test_shard():
    assert [int(v) for v in Dataset.range(10).shard(3, 1)] == [1, 4, 7]
    assert Dataset.range(10).shard(3, 1).cardinality() == 3
    with pytest.raises(InvalidArgumentError, match="Index must be between 0 and 2"):
        Dataset.range(10).shard(3, 3)


def test_any_iterable_is_a_dataset():
    items = [(np.ones(2, np.float32) * i, np.int32(i)) for i in range(3)]
    ds = as_dataset(items)
    assert ds.element_spec == (TensorSpec((2,), np.dtype(np.float32)),
                               TensorSpec((), np.dtype(np.int32)))
    assert ds.cardinality() == 3 and len(values(ds)) == 3 and len(values(ds)) == 3
    gen = as_dataset(np.full(2, i) for i in range(4))  # a one-shot iterator
    assert gen.element_spec == TensorSpec((2,), np.dtype(np.int64))
    assert [int(e[0]) for e in gen] == [0, 1, 2, 3]  # the peeked element is not lost
    assert gen.cardinality() == UNKNOWN_CARDINALITY
    with pytest.raises(TypeError, match="iterable"):
        as_dataset(3)
