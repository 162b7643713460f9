"""The reductions as the steps of a plan (:mod:`collectives._engine.plan`): ``cross_replica_sum``,
``cross_replica_mean``, ``cross_replica_reduce`` (an all-reduce) and ``reduce_scatter``.

Reductions keep the canonical tree order (:mod:`collectives._engine.tree`). The replicas of a group
on one instance hold consecutive positions in the group, a block; an instance reduces ahead
only the nodes of the tree that lie inside its block (:func:`~collectives._engine.tree.subtrees`).
Usually the block is one node, and the tree of the instances' partials in instance order is
the group's (:func:`~collectives._engine.tree.block_nodes` is None: 2x4, 4x2, 3 instances
of 4 of 12, ...); where a block is cut unevenly (positions 1 and 2 of a group of 3: the tree is
``(p0 + p1) + p2``), the instance has one partial per node of its block instead. The steps:

1. **combine**: this instance's partials (:func:`local_partial`, ``prepare`` applied), one
   per group it takes part in (or per node of its block); a reduce-scatter's padded with
   zeros to ``k * c`` elements, ``c = ceil(n / k)``.
2. **agree** (the plan's): a small call over every instance carries the partials in its
   agreement, each instance's whole payload to every instance (``gathered``), or, for a
   reduce-scatter whose instances need only their own chunks, each instance's chunk of
   every payload (``indexed``).
3. **exchange**: otherwise the instances of a group exchange their partials by chunk owner
   (an all-to-all: member j receives every member's chunk j; :class:`Exchange`); between
   two members an all-reduce of at most :data:`PAIR_ALLREDUCE_MAX_BYTES` sends its whole
   partials instead.
4. **finish**: each member combines what it received in the tree order, ``finish`` applied
   (MEAN divides); an all-reduce's members all-gather their reduced chunks into the result;
   each local replica gets its own array.

That is the traffic of a ring: about ``2(m-1)/m`` of the tensor per member for an
all-reduce, ``(m-1)/m`` for a reduce-scatter. Sizes are elements unless named bytes.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives._engine.exchange import Exchange, combiner, run_steps
from collectives._engine.members import give, local_members, reduction_groups
from collectives._engine.tree import combine_steps
from collectives.groups import CommGroup
from collectives.operators import CollectiveOperator, finish, finish_into, prepare
from collectives.transports.base import Carry

__all__ = ["Reduction", "local_partial", "padded"]


def padded(x: np.ndarray, length: int) -> np.ndarray:
    """``x`` (1-D, at most ``length`` elements) completed with zeros to ``length`` elements:
    ``x`` itself when it has them, else a new array (a reduce-scatter's padding)."""
    if x.shape[0] == length:
        return x
    out = np.zeros(length, x.dtype)
    out[:x.shape[0]] = x
    return out


def local_partial(engine, values: Sequence[np.ndarray], members: Sequence[int],
                  op: CollectiveOperator) -> np.ndarray:
    """The tree reduction of this instance's members of ``members`` (``prepare`` applied):
    a node of the group's tree when ``members`` are its members at the node's positions
    (:func:`~collectives._engine.tree.subtrees`), or the whole group on one instance. Large ones in
    slices on several threads (per element the same tree)."""
    offset = engine.replica_index_offset
    inputs = [values[r - offset] for r in local_members(engine, members)]
    combine = combiner(op, inputs[0].dtype)
    if len(inputs) == 1:
        return prepare(op, inputs[0])
    steps = combine_steps(tuple((i, i + 1) for i in range(len(inputs))))
    if inputs[0].ndim == 0:  # (0-d: new arrays, never written into)
        return run_steps(steps, [prepare(op, x) for x in inputs],
                         lambda a, b, out: np.asarray(combine(a, b, None)))
    flats = [np.ascontiguousarray(x).reshape(-1) for x in inputs]
    out = np.empty(flats[0].size, flats[0].dtype)

    def reduce(lo: int, hi: int) -> None:
        run_steps(steps, [prepare(op, f[lo:hi]) for f in flats], combine, out[lo:hi])

    engine.in_slices(out.size, out.itemsize, reduce)
    return out.reshape(inputs[0].shape)


class _Group:
    """A group this instance takes part in: its members, its local members, its instances,
    the nodes of the tree this instance's partials reduce (``mine``: None, one partial),
    the chunk size ``c`` of a reduce-scatter (0 for an all-reduce), its padded length and
    every instance's bounds in it."""

    __slots__ = ("members", "local", "instances", "nodes", "mine", "c", "length", "bounds")

    def __init__(self, engine, entry, n: int, scatter: bool):
        members, local, instances, blocks, nodes = entry
        self.members, self.local, self.instances, self.nodes = members, local, instances, nodes
        self.mine = None if nodes is None else \
            nodes[instances.index(engine.process_index)]
        k = len(members)
        self.c = -(-n // k) if scatter else 0
        self.length = k * self.c if scatter else n
        self.bounds = [lo * self.c for lo, _ in blocks] + [k * self.c] if scatter else None


class Reduction:
    """The steps of an all-reduce (``scatter`` False) or a reduce-scatter with ``op`` over
    ``group``, for inputs of ``dtype`` and ``shape`` (a reduce-scatter's rank 1) on
    ``engine`` (module docstring); ``text``: the call's text in its waits' messages.

    Attributes:
        sent: bytes this instance sends in one call, when its data is exchanged.
        exchanges: one :class:`Exchange` per set of instances this instance's groups span,
            in the order of their first group (the same on every instance).
        carried: the payload the plan chose to carry in the agreement (:meth:`carry`), or
            None.
    """

    def __init__(self, engine, text, op: CollectiveOperator, group: CommGroup,
                 scatter: bool, dtype: np.dtype, shape: tuple[int, ...]):
        self._engine, self._op, self._scatter = engine, op, scatter
        self._dtype, self._shape = np.dtype(dtype), tuple(shape)
        n = int(np.prod(shape, dtype=np.int64))
        self._n = n
        self._groups = [_Group(engine, e, n, scatter) for e in reduction_groups(engine, group)]
        self._local = op is CollectiveOperator.LOCAL
        self._mean = op is CollectiveOperator.MEAN
        self._square = op is CollectiveOperator.SQUARE_ADD
        self._pad = scatter and self._groups[0].length != n  # (a reduce-scatter's padding)
        # one local replica: its partial of its one group is its value (prepared)
        self._one = engine.num_local_replicas == 1 and len(self._groups) == 1
        #: whether :meth:`combine` does anything (one local replica: its value is its
        #: partial, unless an operator prepares it or a reduce-scatter pads it)
        self.combines = not self._one or self._square or self._pad or self._local
        self._alone = [g for g in self._groups if len(g.instances) == 1]
        by_set: dict[tuple, list[_Group]] = {}
        for g in self._groups:
            if len(g.instances) > 1 and not self._local:
                by_set.setdefault((g.instances, g.nodes), []).append(g)
        self._sets = list(by_set.values())
        self.exchanges = []
        for groups in self._sets:
            instances, nodes, k = groups[0].instances, groups[0].nodes, len(groups[0].members)
            self.exchanges.append(Exchange(
                engine.scratch, engine.communicator(instances),
                engine.data_patience(text, instances),
                [g.length for g in groups], self._dtype, op, not scatter,
                [g.bounds for g in groups] if scatter else None, nodes,
                (lambda chunk, k=k: finish_into(op, chunk, k)) if self._mean and not scatter
                else None, [self._shape] * len(groups)))
        self.sent = sum(ex.sent for ex in self.exchanges)
        self._combine = combiner(op, self._dtype)
        self.carried: Carry | None = None
        self._into: np.ndarray | None = None  # (the carried payload's typed send buffer)
        self._blocks = None  # the blocks whose rows _slots holds (the carried ones)
        self._slots: list = []

    # -- what the plan chooses from -------------------------------------------------------

    def carry(self, engine) -> Carry | None:
        """The payload this call's agreement can carry (module docstring): every
        instance's partials, for a group of every replica and an operator other than
        LOCAL; else None."""
        if self._local or len(self._groups) != 1 or not self._sets:
            return None
        g = self._groups[0]
        if len(g.members) != engine.num_replicas:
            return None
        per = g.length * self._dtype.itemsize
        if g.nodes is None:
            return Carry.gathered([per] * engine.transport.process_count)
        return Carry.gathered([per * len(ns) for ns in g.nodes])

    def piece(self, engine) -> int:
        """Bytes of each instance's piece of every payload, when each needs only its own
        (a reduce-scatter whose instances each hold one node: their chunks); else 0."""
        if not self._scatter or self._local or self._groups[0].nodes is not None:
            return 0
        return engine.num_local_replicas * self._groups[0].c * self._dtype.itemsize

    def result_bytes(self) -> int:
        """Bytes of this instance's results (a reduce-scatter's at most)."""
        return self._n * self._dtype.itemsize

    def posts(self) -> bool:
        """Whether its data is one exchange that may start before the agreement: a
        reduce-scatter exchange (not the pair form) on a communicator that posts."""
        return (len(self.exchanges) == 1 and self.exchanges[0].postable
                and self.exchanges[0].capabilities.posts)

    def carry_into(self, carry: Carry, send: np.ndarray) -> None:
        """The plan carries ``carry`` in the agreement, its payload written into ``send``."""
        self.carried = carry
        g = self._groups[0]
        if g.nodes is None:  # (one partial: written as it lies, shaped as the value's)
            self._into = send.view(self._dtype).reshape(
                self._shape if g.length == self._n and not self._scatter else (g.length,))
        if carry.piece:
            self._rows_at = (None, 0, 0)
        elif self._scatter:
            lo = self._engine.replica_index_offset * g.c
            self._rows_at = (g.length, lo, lo + self._engine.num_local_replicas * g.c)
        else:
            self._rows_at = (self._n, 0, self._n)
        nodes = tuple((i, i + 1) for i in range(len(carry.sizes))) if g.nodes is None else \
            tuple(node for ns in g.nodes for node in ns)
        self._carried_steps = combine_steps(nodes)

    # -- the steps ------------------------------------------------------------------------

    def combine(self, values: Sequence[np.ndarray]) -> list:
        """Step 1: per group, this instance's partial (``prepare`` applied; a
        reduce-scatter's 1-D and padded to ``k * c``), or a list of one per node of its
        block."""
        if self._local:
            return []
        if self._one:  # (its partial: its value, prepared; a reduce-scatter's padded)
            partial = values[0] if not self._square else prepare(self._op, values[0])
            return [padded(partial, self._groups[0].length) if self._pad else partial]
        engine, op, out = self._engine, self._op, []
        for g in self._groups:
            parts = [local_partial(engine, values, g.members, op)] if g.mine is None else \
                [local_partial(engine, values, g.members[lo:hi], op) for lo, hi in g.mine]
            if self._scatter:
                parts = [padded(p.reshape(-1), g.length) for p in parts]
            out.append(parts[0] if g.mine is None else parts)
        return out

    def fill(self, partials: list, send: np.ndarray) -> None:
        """Step 2's payload: this instance's partials, written into the agreement's send
        buffer (one group, of every replica)."""
        partial = partials[0]
        if self._into is not None:
            self._into[...] = partial
            return
        at = 0
        for p in partial:
            flat = np.ascontiguousarray(p).reshape(-1).view(np.uint8)
            send[at:at + flat.nbytes] = flat
            at += flat.nbytes

    def start(self, partials: list, posted: int | None = None):
        """Step 3 of the first (the only, when posted) exchange."""
        return self.exchanges[0].start(self._exchanged(partials, 0), posted)

    def withdraw(self, started) -> None:
        """The call did not agree: its exchange posted before the agreement is withdrawn."""
        started[0].withdraw()

    def finish(self, values: Sequence[np.ndarray], partials: list, blocks, started) -> list:
        """Step 4: one result per local replica, from the carried ``blocks``, or from the
        exchanges (``started``: the first one's, started before the agreement, or None)."""
        if blocks is not None:  # carried: every instance's partials, in the blocks
            if blocks is not self._blocks:  # (the rows made again only for other blocks)
                self._slots, self._blocks = self._rows(blocks), blocks
            total = run_steps(self._carried_steps, self._slots, self._combine)
            if not self._scatter and total.shape != self._shape:
                total = total.reshape(self._shape)
            if self._one:  # (its one result: a new array)
                return [finish(self._op, total, self._engine.num_replicas) if self._mean
                        else total]
            results: list = [None] * len(values)
            self._hand(results, self._groups[0], total, values)
            return results
        results = [None] * len(values)
        if self._local:
            return self._own(values, results)
        for g, partial in zip(self._groups, partials):
            if len(g.instances) == 1:
                self._hand(results, g, partial, values, whole=True)
        for i, (ex, groups) in enumerate(zip(self.exchanges, self._sets)):
            if i or started is None:
                started = ex.start(self._exchanged(partials, i))
            for g, total in zip(groups, ex.finish(started)):
                self._hand(results, g, total, values, finished=not self._scatter)
        return results

    def _own(self, values: Sequence[np.ndarray], results: list) -> list:
        """LOCAL: every replica keeps its own value (a reduce-scatter's chunk of it)."""
        offset = self._engine.replica_index_offset
        for g in self._groups:
            for r in g.local:
                v = values[r - offset]
                if self._scatter:
                    p, c = g.members.index(r), g.c
                    v = padded(v, g.length)[p * c:(p + 1) * c]
                results[r - offset] = v.copy()
        return results

    def _exchanged(self, partials: list, i: int) -> list:
        """The partials of exchange ``i``'s groups."""
        groups = self._sets[i]
        return [p for g, p in zip(self._groups, partials) if g in groups]

    def _hand(self, results: list, g: _Group, total: np.ndarray, values, whole=False,
              finished=False) -> None:
        """Give group ``g``'s reduction (``whole``: the group's whole partial, on this
        instance alone; else this instance's region of it, a reduce-scatter's) to its local
        replicas, ``finish`` applied (unless ``finished``: by the exchange)."""
        engine = self._engine
        if self._mean and not finished:
            total = finish(self._op, total, len(g.members))
        if not self._scatter:
            if self._one and not whole:  # (its one result: a new array)
                results[0] = total
            else:
                give(results, engine, g.local, total, values)
            return
        c, offset = g.c, engine.replica_index_offset
        first = 0 if whole else \
            g.bounds[g.instances.index(engine.process_index)] // c
        for r in g.local:
            p = g.members.index(r) - first
            part = total[p * c:(p + 1) * c]
            results[r - offset] = part.copy() if whole else part  # (disjoint slices)

    def _rows(self, blocks) -> list[np.ndarray]:
        """The typed rows of the carried ``blocks`` that this instance combines: every
        instance's partials (an all-reduce), or their elements of this instance's chunks (a
        reduce-scatter; indexed: the pieces themselves), in the tree's order. Made again
        only for another list of blocks: a transport hands the same one again while its
        views stay valid (MPI's reused agreement), and run_steps keeps its intermediates
        after the rows."""
        g, dtype = self._groups[0], self._dtype
        stride, lo, hi = self._rows_at
        if stride is None:
            return [b.view(dtype) for b in blocks]
        if g.nodes is None:
            return [b.view(dtype)[lo:hi] for b in blocks]
        return [b.view(dtype)[t * stride + lo:t * stride + hi]
                for b, ns in zip(blocks, g.nodes) for t in range(len(ns))]
