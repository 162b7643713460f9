"""Pure pieces: the canonical tree, replica groups, operators, output tagging, IPUConfig."""

import numpy as np
import pytest

import ipu_node
from collectives._engine.descriptor import Descriptor
from collectives.groups import CommGroup, CommGroupType, consecutive
from collectives.operators import CollectiveOperator, combine_into, finish, parse_operator
from collectives._engine.exchange import node_reduce, run_steps, tree_reduce
from collectives._engine.tree import block_nodes, combine_steps, split_point, subtrees
from launch.mpirun import instance_command
from launch.output import LineTagger


def _show(items):
    return tree_reduce(items, lambda a, b, out: f"({a}+{b})")


@pytest.mark.parametrize("n, order", [
    (1, "0"), (2, "(0+1)"), (3, "((0+1)+2)"), (4, "((0+1)+(2+3))"),
    (6, "(((0+1)+(2+3))+(4+5))"), (8, "(((0+1)+(2+3))+((4+5)+(6+7)))"),
])
def test_canonical_tree_splits_at_powers_of_two(n, order):
    assert _show([str(i) for i in range(n)]) == order


def test_aligned_power_of_two_blocks_are_subtrees():
    # 8 items as 2 blocks of 4: combining the blocks' partials gives the same tree.
    full = _show([str(i) for i in range(8)])
    blocks = [_show([str(i) for i in range(b, b + 4)]) for b in (0, 4)]
    assert _show(blocks) == full
    assert split_point(5) == 4 and split_point(2) == 1 and split_point(9) == 8


@pytest.mark.parametrize("lo, hi, n, nodes", [
    (1, 3, 3, [(1, 2), (2, 3)]), (0, 2, 3, [(0, 2)]), (2, 3, 3, [(2, 3)]),
    (0, 3, 6, [(0, 2), (2, 3)]), (3, 6, 6, [(3, 4), (4, 6)]), (2, 6, 6, [(2, 4), (4, 6)]),
    (0, 6, 6, [(0, 6)]), (4, 6, 6, [(4, 6)]), (1, 8, 8, [(1, 2), (2, 4), (4, 8)]),
    (3, 9, 9, [(3, 4), (4, 8), (8, 9)]), (8, 12, 12, [(8, 12)]),
])
def test_subtrees_are_the_largest_nodes_inside_a_block(lo, hi, n, nodes):
    assert list(subtrees(lo, hi, n)) == nodes
    # each is a node: its reduction appears whole in the tree of [0, n)
    full = _show([str(i) for i in range(n)])
    for a, b in nodes:
        assert _show([str(i) for i in range(a, b)]) in full


def test_block_nodes_keep_one_partial_per_block_only_where_that_is_the_tree():
    assert block_nodes(8, ((0, 4), (4, 8))) is None        # 2 x 4
    assert block_nodes(6, ((0, 2), (2, 4), (4, 6))) is None  # 3 x 2: ([0,4)) + [4,6)
    assert block_nodes(3, ((0, 2), (2, 3))) is None
    assert block_nodes(12, ((0, 4), (4, 8), (8, 12))) is None
    assert block_nodes(3, ((0, 1), (1, 3))) == (((0, 1),), ((1, 2), (2, 3)))
    assert block_nodes(6, ((0, 3), (3, 6))) == (((0, 2), (2, 3)), ((3, 4), (4, 6)))
    # every block a node, yet three partials in block order are not the tree of 6
    assert block_nodes(6, ((0, 4), (4, 5), (5, 6))) == (((0, 4),), ((4, 5),), ((5, 6),))
    with pytest.raises(ValueError, match="do not cover"):
        block_nodes(4, ((0, 2), (3, 4)))


def test_even_blocks_of_a_power_of_two_need_one_partial_each():
    # (a power-of-two count of local replicas: each instance's block is one node)
    for m in range(1, 10):
        for L in (1, 2, 4, 8):
            assert block_nodes(m * L, tuple((i * L, (i + 1) * L) for i in range(m))) is None
        for L in (3, 5, 6, 12):
            assert (block_nodes(m * L, tuple((i * L, (i + 1) * L) for i in range(m)))
                    is None) == (m == 1), (m, L)


@pytest.mark.parametrize("n, blocks", [(3, ((0, 1), (1, 3))), (6, ((0, 3), (3, 6))),
                                       (6, ((0, 4), (4, 5), (5, 6))),
                                       (9, ((0, 3), (3, 6), (6, 9))), (5, ((0, 5),))])
def test_node_reduce_of_each_blocks_subtrees_is_the_tree(n, blocks):
    nodes = [node for lo, hi in blocks for node in subtrees(lo, hi, n)]
    partials = [_show([str(i) for i in range(a, b)]) for a, b in nodes]
    assert node_reduce(nodes, partials, lambda a, b, out: f"({a}+{b})") == \
        _show([str(i) for i in range(n)])


def test_node_reduce_refuses_what_is_not_a_cover_of_nodes():
    def first(a, b, out):
        return a

    with pytest.raises(ValueError, match="do not cover"):
        node_reduce([(1, 2), (2, 3)], ["b", "c"], first)
    with pytest.raises(ValueError, match="not all nodes"):
        node_reduce([(0, 3), (3, 6)], ["a", "b"], first)  # the tree of 6 splits at 4
    with pytest.raises(ValueError, match="2 items on 1 nodes"):
        node_reduce([(0, 2)], ["a", "b"], first)


def test_node_reduce_does_not_modify_inputs_it_does_not_own():
    items = [np.full(3, float(i)) for i in range(3)]
    copies = [a.copy() for a in items]
    out = node_reduce([(0, 1), (1, 2), (2, 3)], items,
                      lambda a, b, out: np.add(a, b, out=out) if out is not None
                      else a + b)
    assert np.array_equal(out, np.full(3, 3.0))
    assert all(np.array_equal(a, c) for a, c in zip(items, copies))


def test_tree_reduce_does_not_modify_inputs_it_does_not_own():
    items = [np.full(3, float(i)) for i in range(5)]
    copies = [a.copy() for a in items]
    out = tree_reduce(items, lambda a, b, out: np.add(a, b, out=out) if out is not None
                      else a + b)
    assert np.array_equal(out, np.full(3, 10.0))
    assert all(np.array_equal(a, c) for a, c in zip(items, copies))


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 11, 16, 33])
def test_steps_kept_from_call_to_call_give_tree_reduce_bit_for_bit(n):
    # float16 sums of values of many magnitudes: any other order of combines differs in
    # the last bits. A carried call runs the same steps over the same slots at every call
    # (its intermediates kept there): twice, the same bytes, its items only read.
    rng = np.random.default_rng(n)
    items = [(rng.standard_normal(64) * 10.0 ** rng.integers(-3, 4)).astype(np.float16)
             for _ in range(n)]
    expected = tree_reduce(items, lambda a, b, out: np.add(a, b, out=out)
                           if out is not None else np.add(a, b))
    steps = combine_steps(tuple((i, i + 1) for i in range(n)))
    assert len(steps) == n - 1 and steps[-1][2] == -1
    assert max(d for *_, d in steps) + 1 - n <= (n - 1).bit_length()  # (the tree's depth)
    slots = list(items)
    copies = [a.copy() for a in items]
    for _ in range(2):
        got = run_steps(steps, slots, np.add)
        assert got.tobytes() == expected.tobytes()
    assert all(x.tobytes() == c.tobytes() for x, c in zip(items, copies))  # (read only)


def test_steps_need_nodes_that_cover_the_tree():
    with pytest.raises(ValueError, match="do not cover"):
        combine_steps(((1, 2),))
    with pytest.raises(ValueError, match="not all nodes"):
        combine_steps(((0, 3), (3, 6)))
    assert combine_steps(((0, 1),)) == ()
    assert combine_steps(((0, 1), (1, 2), (2, 3)), (True, False, False)) == (
        (0, 1, 0), (0, 2, -1))  # (an owned item is written into)


@pytest.mark.parametrize("group, members", [
    (CommGroup(), [(0, 1, 2, 3, 4, 5, 6, 7)]),
    (CommGroup(CommGroupType.CONSECUTIVE, 2), [(0, 1), (2, 3), (4, 5), (6, 7)]),
    (CommGroup(CommGroupType.CONSECUTIVE, 4), [(0, 1, 2, 3), (4, 5, 6, 7)]),
    (CommGroup(CommGroupType.ORTHOGONAL, 2), [(0, 4), (1, 5), (2, 6), (3, 7)]),
    (CommGroup(CommGroupType.ORTHOGONAL, 4), [(0, 2, 4, 6), (1, 3, 5, 7)]),
    (CommGroup(CommGroupType.NONE), [(i,) for i in range(8)]),
    (consecutive(None), [tuple(range(8))]),
])
def test_group_membership_follows_gcl(group, members):
    assert [tuple(g) for g in group.members(8)] == members


def test_group_size_must_divide_replicas():
    with pytest.raises(ValueError, match="group size 3 does not divide the number of replicas"):
        CommGroup(CommGroupType.CONSECUTIVE, 3).members(8)
    with pytest.raises(ValueError, match="replica_group_size"):
        consecutive(0)


def test_operators_parse_and_combine():
    assert parse_operator("COLLECTIVE_OP_MAX") is CollectiveOperator.MAX
    assert parse_operator("min") is CollectiveOperator.MIN
    with pytest.raises(ValueError, match="COLLECTIVE_OP_ADD"):
        parse_operator("SUM")
    a, b = np.array([1, 5]), np.array([3, 2])
    assert combine_into(CollectiveOperator.MAX, a, b, None).tolist() == [3, 5]
    assert combine_into(CollectiveOperator.LOGICAL_AND, a, np.array([0, 2]), None).tolist() \
        == [0, 1]
    assert finish(CollectiveOperator.MEAN, np.array([3.0, 5.0]), 2).tolist() == [1.5, 2.5]
    assert finish(CollectiveOperator.MEAN, np.array([3, 5]), 2).tolist() == [1, 2]


def test_descriptor_roundtrip_and_differences():
    d = Descriptor(3, "cross_replica_sum", "COLLECTIVE_OP_ADD", "float32", (4, 2), "ALL(0)",
                   name="grads")
    assert Descriptor.decode(d.encode()) == d
    other = Descriptor(3, "cross_replica_sum", "COLLECTIVE_OP_ADD", "float32", (4,), "ALL(0)",
                       name="grads")
    assert d.differences(other) == ["shape (4, 2) vs (4,)"]


def test_a_plans_fingerprint_of_call_seq_is_its_descriptors():
    from collectives._engine.plan import seq_fingerprint
    d = Descriptor(0, "all_gather", "", "int32", (3,), "ALL(0)")
    for seq in (0, 1, 7, 1 << 40):
        assert seq_fingerprint(d.fingerprint(), seq) == d.with_seq(seq).fingerprint()
    assert d.fingerprint() != d.with_seq(1).fingerprint()


def test_line_tagger_tags_whole_lines_and_progress_refreshes():
    out = []
    tagger = LineTagger("[1,2]<stdout>:", out.append)
    tagger.feed(b"hel")
    assert out == []
    tagger.feed(b"lo\nwor")
    tagger.feed(b"ld\n\rbar 1\rbar 2\r\n")
    tagger.feed(b"no newline")
    tagger.close()
    assert out == ["[1,2]<stdout>:hello\n", "[1,2]<stdout>:world\n", "[1,2]<stdout>:bar 1\n",
                   "[1,2]<stdout>:bar 2\n", "[1,2]<stdout>:no newline\n"]


def test_line_tagger_drops_a_bar_clearing_itself_but_keeps_empty_lines():
    out = []
    tagger = LineTagger("[1,0]<stderr>:", out.append)
    tagger.feed(b"\rbar 50%\r      \r")       # tqdm.write clears the bar with spaces
    tagger.feed(b"epoch 1\n\nafter an empty line\rbar 60%\r")
    tagger.feed(b"\n")                        # "\r\n" split between two reads
    tagger.close()
    assert out == ["[1,0]<stderr>:bar 50%\n", "[1,0]<stderr>:epoch 1\n", "[1,0]<stderr>:\n",
                   "[1,0]<stderr>:after an empty line\n", "[1,0]<stderr>:bar 60%\n"]


def test_python_programs_run_under_the_bootstrap():
    import sys
    assert instance_command(["python", "-u", "t.py", "-x"]) == \
        [sys.executable, "-u", "-m", "launch.bootstrap", "t.py", "-x"]
    assert instance_command(["/usr/bin/python3", "-X", "dev", "-m", "pytest", "-q"]) == \
        ["/usr/bin/python3", "-X", "dev", "-m", "launch.bootstrap", "-m", "pytest", "-q"]
    assert instance_command(["echo", "hi"]) == ["echo", "hi"]
    assert instance_command(["python", "-u", "t.py"], guard=True) == \
        [sys.executable, "-u", "-m", "launch.bootstrap", "--guard", "t.py"]
    assert instance_command(["echo", "hi"], guard=True) == \
        [sys.executable, "-m", "launch.bootstrap", "--exec", "echo", "hi"]


def test_ipu_config_rejects_unknown_options_and_bad_values():
    cfg = ipu_node.IPUConfig()
    with pytest.raises(AttributeError, match="no option 'auto_selct_ipus'"):
        cfg.auto_selct_ipus = 2
    with pytest.raises(TypeError, match="str 'a'"):
        cfg.auto_select_ipus = [1, "a"]
    with pytest.raises(ValueError, match="ipu_model.version"):
        cfg.ipu_model.version = "ipu3"
    with pytest.raises(ValueError, match="tiles_per_ipu"):
        cfg.ipu_model.tiles_per_ipu = -1
    with pytest.raises(ipu_node.IPUConfigError, match="asks for no IPUs"):
        ipu_node.IPUConfig().configure_ipu_system()
