"""Cases and numpy oracles for the collectives, shared by the in-process tests, the per-rank
suite and the layout-invariance program.

A case is one collective call; every replica's input is a function of (case, global replica
index) only, so every layout computes the same thing. The oracles are independent of
``collectives``: they reduce in the canonical tree order (DESIGN.md) with plain numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import collectives as C

FLOATS = ("float16", "float32", "float64")
INTS = ("int32", "int64")
DTYPES = FLOATS + INTS + ("bool",)
OPERATORS = ("ADD", "MUL", "MIN", "MAX", "LOGICAL_AND", "LOGICAL_OR", "SQUARE_ADD", "LOCAL",
             "MEAN")
BOOL_OPERATORS = ("LOGICAL_AND", "LOGICAL_OR", "LOCAL")
ALL = C.CommGroup(C.CommGroupType.ALL)


def groups_for(num_replicas: int) -> list[C.CommGroup]:
    """ALL, NONE, and every CONSECUTIVE/ORTHOGONAL size of 2..R-1 dividing R (sizes 2, 4
    for 8 replicas)."""
    out = [ALL, C.CommGroup(C.CommGroupType.NONE)]
    for k in range(2, num_replicas):
        if num_replicas % k == 0:
            out += [C.CommGroup(C.CommGroupType.CONSECUTIVE, k),
                    C.CommGroup(C.CommGroupType.ORTHOGONAL, k)]
    return out


@dataclass(frozen=True)
class Case:
    op: str                      # cross_replica_reduce, reduce_scatter, all_gather, ...
    dtype: str
    group: C.CommGroup
    operator: str = ""
    shape: tuple = (5, 3)
    params: tuple = ()

    @property
    def key(self) -> str:
        p = ",".join(map(str, self.params))
        return (f"{self.op}-{self.operator}-{self.dtype}-{self.group}-"
                f"{'x'.join(map(str, self.shape))}-{p}")


def make_input(case: Case, replica: int) -> np.ndarray:
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(case.key)) % (2**31)
    rng = np.random.default_rng([seed, replica])
    if case.dtype == "bool":
        # mostly-true for AND, mostly-false for OR, so results are not all trivial
        p = 0.85 if case.operator == "LOGICAL_AND" else 0.15
        return rng.random(case.shape) < p
    if case.dtype in INTS:
        low, high = (1, 3) if case.operator == "MUL" else (-50, 51)
        return rng.integers(low, high, case.shape).astype(case.dtype)
    scale = 1.0 if case.operator == "MUL" else (10.0 if case.dtype == "float16" else 100.0)
    values = rng.standard_normal(case.shape) * scale
    if case.operator == "MUL":
        values = 1.0 + 0.1 * values
    return values.astype(case.dtype)


def all_cases(num_replicas: int, dtypes=DTYPES) -> list[Case]:
    """Every op x operator x group x dtype that is valid for ``num_replicas``."""
    cases = []
    for group in groups_for(num_replicas):
        for dtype in dtypes:
            for operator in OPERATORS:
                if dtype == "bool" and operator not in BOOL_OPERATORS:
                    continue
                cases.append(Case("cross_replica_reduce", dtype, group, operator, (5, 3)))
                cases.append(Case("reduce_scatter", dtype, group, operator, (7,)))
            cases.append(Case("all_gather", dtype, group, shape=(2, 3)))
            k = group_size(group, num_replicas)
            cases.append(Case("all_to_all", dtype, group, shape=(2 * k, 3), params=(0, 1)))
            cases.append(Case("all_to_all", dtype, group, shape=(3, k), params=(1, 0)))
            cases.append(Case("broadcast", dtype, group, shape=(4,), params=(k - 1,)))
    return cases


def group_size(group: C.CommGroup, num_replicas: int) -> int:
    return len(group.members(num_replicas)[0])


def run_case(case: Case, replica: int) -> np.ndarray:
    """Call the collective of ``case`` (inside a replica function)."""
    x = make_input(case, replica)
    if case.op == "cross_replica_reduce":
        return C.cross_replica_reduce(x, case.operator, group=case.group)
    if case.op == "reduce_scatter":
        return C.reduce_scatter(x, op="COLLECTIVE_OP_" + case.operator, group=case.group)
    if case.op == "all_gather":
        return C.all_gather(x, group=case.group)
    if case.op == "all_to_all":
        return C.all_to_all(x, case.params[0], case.params[1], group=case.group)
    if case.op == "broadcast":
        return C.broadcast(x, case.params[0], group=case.group)
    raise ValueError(case.op)


# -- oracles ----------------------------------------------------------------------------

def _tree(values, f):
    if len(values) == 1:
        return values[0]
    p = 1 << ((len(values) - 1).bit_length() - 1)
    return f(_tree(values[:p], f), _tree(values[p:], f))


_F = {
    "ADD": np.add, "SQUARE_ADD": np.add, "MEAN": np.add, "MUL": np.multiply,
    "MIN": np.minimum, "MAX": np.maximum,
}


def reduce_oracle(operator: str, values: list[np.ndarray], own: np.ndarray) -> np.ndarray:
    """``operator`` over ``values`` (group position order) in the canonical tree."""
    dtype = values[0].dtype
    if operator == "LOCAL":
        return own
    if operator in ("LOGICAL_AND", "LOGICAL_OR"):
        f = np.logical_and if operator == "LOGICAL_AND" else np.logical_or
        return _tree(values, lambda a, b: f(a, b).astype(dtype))
    if operator == "SQUARE_ADD":
        values = [np.multiply(v, v) for v in values]
    total = _tree(values, lambda a, b: _F[operator](a, b))
    if operator == "MEAN":
        k = dtype.type(len(values))
        return (np.floor_divide(total, k) if np.issubdtype(dtype, np.integer)
                else np.true_divide(total, k))
    return total


def oracle(case: Case, replica: int, num_replicas: int) -> np.ndarray:
    """What replica ``replica`` must get for ``case``."""
    members = next(m for m in case.group.members(num_replicas) if replica in m)
    pos, k = members.index(replica), len(members)
    xs = [make_input(case, r) for r in members]
    own = xs[pos]
    if case.op == "cross_replica_reduce":
        return reduce_oracle(case.operator, xs, own)
    if case.op == "reduce_scatter":
        n = xs[0].shape[0]
        c = -(-n // k)
        padded = [np.concatenate([x, np.zeros(k * c - n, x.dtype)]) for x in xs]
        return reduce_oracle(case.operator, padded, padded[pos])[pos * c:(pos + 1) * c]
    if case.op == "all_gather":
        return np.stack(xs)
    if case.op == "all_to_all":
        split, concat = case.params
        return np.concatenate([np.split(x, k, axis=split)[pos] for x in xs], axis=concat)
    if case.op == "broadcast":
        return xs[case.params[0]]
    raise ValueError(case.op)


def check_cases(strategy, cases: list[Case]) -> None:
    """Run ``cases`` in one ``strategy.run`` (every replica, in order) and compare each
    replica's results with the oracles (bit-identical)."""
    R = strategy.num_replicas_in_sync

    def step():
        r = int(C.replication_index())
        return r, [run_case(case, r) for case in cases]

    for r, results in strategy.run(step):
        for case, result in zip(cases, results):
            assert_same(result, oracle(case, r, R), f"{case.key} on replica {r}")


def assert_same(result, expected, what: str) -> None:
    """Bit-identical: same dtype, shape and bytes (NaN-safe)."""
    result = np.asarray(result)
    assert isinstance(result, np.ndarray), what
    assert result.dtype == expected.dtype, f"{what}: dtype {result.dtype} != {expected.dtype}"
    assert result.shape == expected.shape, f"{what}: shape {result.shape} != {expected.shape}"
    assert result.tobytes() == expected.tobytes(), \
        f"{what}: values differ\n got {result!r}\nwant {expected!r}"


# -- nests: one call on many arrays (tensor fusion) -------------------------------------------

#: more shapes per op, so that a nest mixes shapes (and 0-d arrays) as well as dtypes
_OTHER_SHAPES = {"cross_replica_reduce": [()], "reduce_scatter": [(3,)],
                 "all_gather": [(5,)], "broadcast": [()]}
#: the operators nests are tried with (each with every dtype it takes; the operators are
#: elementwise, so the others would add time, not cases)
NEST_OPERATORS = {"cross_replica_reduce": ("ADD", "MEAN", "LOGICAL_AND"),
                  "reduce_scatter": ("ADD", "MAX", "LOCAL")}


def _other_shapes(case: Case, k: int) -> list[tuple]:
    if case.op == "all_to_all":
        return [(k, 2)] if case.params == (0, 1) else [(2, 2 * k)]  # (split, concat)
    return _OTHER_SHAPES[case.op]


def nest_cases(num_replicas: int, dtypes=DTYPES) -> dict[str, list[Case]]:
    """Cases that one nest call covers, by nest key: the cases of :func:`all_cases` with
    the same op, operator (of :data:`NEST_OPERATORS`), group and parameters, each dtype,
    each also in another shape."""
    nests: dict[str, list[Case]] = {}
    for case in all_cases(num_replicas, dtypes):
        if case.operator and case.operator not in NEST_OPERATORS[case.op]:
            continue
        key = f"nest:{case.op}-{case.operator}-{case.group}-{','.join(map(str, case.params))}"
        k = group_size(case.group, num_replicas)
        variants = [case] + [Case(case.op, case.dtype, case.group, case.operator, shape,
                                  case.params) for shape in _other_shapes(case, k)]
        nests.setdefault(key, []).extend(variants)
    return nests


def _as_nest(values: list):
    """``values`` in a nested structure: a dict of a list and a tuple."""
    half = len(values) // 2
    return {"first": list(values[:half]), "second": tuple(values[half:])}


def _from_nest(nest) -> list:
    return [*nest["first"], *nest["second"]]


def run_nest(cases: list[Case], replica: int) -> list[np.ndarray]:
    """One collective call on the nest of every case's input; the results in case order."""
    x = _as_nest([make_input(case, replica) for case in cases])
    case = cases[0]
    if case.op == "cross_replica_reduce":
        out = C.cross_replica_reduce(x, case.operator, group=case.group)
    elif case.op == "reduce_scatter":
        out = C.reduce_scatter(x, op="COLLECTIVE_OP_" + case.operator, group=case.group)
    elif case.op == "all_gather":
        out = C.all_gather(x, group=case.group)
    elif case.op == "all_to_all":
        out = C.all_to_all(x, case.params[0], case.params[1], group=case.group)
    elif case.op == "broadcast":
        out = C.broadcast(x, case.params[0], group=case.group)
    else:
        raise ValueError(case.op)
    assert isinstance(out, dict) and isinstance(out["first"], list) \
        and isinstance(out["second"], tuple), type(out)
    return _from_nest(out)


def packed(results: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Arrays as two arrays (fewer entries to save): their bytes one after the other, and
    their dtypes and shapes as text."""
    results = [np.asarray(r) for r in results]
    blob = np.frombuffer(b"".join(r.tobytes() for r in results), np.uint8)
    return blob, np.array(repr([(r.dtype.str, r.shape) for r in results]))
