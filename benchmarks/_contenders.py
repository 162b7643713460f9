"""The raw baselines of ``benchmarks/collectives.py``: mpi4py's buffer calls (MPI) and
torch.distributed's gloo (gRPC), each timed in place and into a fresh result like ours.

Every op of ours returns a fresh array (TF-IPU semantics), so the fresh-result form of a
raw call writes into a new ``np.empty`` (or tensor) too; a raw broadcast overwrites the
root's buffer in place, so its root broadcasts its input and then copies it. Issue 10 lets
all_gather and broadcast count that copy; the in-place form is timed as well (see
``benchmarks/collectives.py``)."""

from __future__ import annotations

from functools import partial

import numpy as np

__all__ = ["RawGloo", "RawMPI", "raw_contender"]


class RawMPI:
    """The raw calls of mpi4py on a duplicate of COMM_WORLD (the baseline)."""

    name = "mpi4py"

    def __init__(self):
        from mpi4py import MPI
        self.comm = MPI.COMM_WORLD.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def op(self, op: str, x: np.ndarray, out: np.ndarray):
        comm = self.comm
        return {
            "cross_replica_sum": lambda: comm.Allreduce(x, out),
            "all_gather": lambda: comm.Allgather(x, out),
            "reduce_scatter": lambda: comm.Reduce_scatter_block(x, out),
            "all_to_all": lambda: comm.Alltoall(x, out),
            "broadcast": lambda: comm.Bcast(x, 0),
        }[op]

    def allreduce(self, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Sum ``x`` over the instances into ``out``; returns ``out``."""
        self.comm.Allreduce(x, out)
        return out

    def barrier(self) -> None:
        self.comm.Barrier()

    def fresh(self, op: str, x: np.ndarray, out: np.ndarray):
        """The raw call that returns a fresh result like ours (module docstring): into a new
        ``np.empty`` shaped like ``out``; ``Bcast``: the root broadcasts ``x`` and copies
        it, the others receive into a new array."""
        comm, shape, dtype = self.comm, out.shape, out.dtype
        call = {"cross_replica_sum": comm.Allreduce, "all_gather": comm.Allgather,
                "reduce_scatter": comm.Reduce_scatter_block, "all_to_all": comm.Alltoall,
                }.get(op)
        if call is None:
            return _fresh_broadcast(self.rank == 0, x, partial(comm.Bcast, root=0))

        def fresh_call():
            result = np.empty(shape, dtype)
            call(x, result)
            return result
        return fresh_call


def _fresh_broadcast(is_root: bool, x: np.ndarray, bcast):
    """``() -> result``: a raw broadcast from instance 0 that returns a fresh array like
    ours (module docstring): the root broadcasts ``x`` then copies it, the others receive
    into a new array. ``bcast(array)``: the raw in-place broadcast of ``array``."""
    if is_root:
        def root():
            bcast(x)
            return x.copy()
        return root

    def receive():
        result = np.empty(x.shape, x.dtype)
        bcast(result)
        return result
    return receive


class RawGloo:
    """torch.distributed's gloo backend (the gRPC transport's contender), when torch is
    installed; its rendezvous is a TCP store on the port given by the driver."""

    name = "gloo"

    def __init__(self, rank: int, size: int, port: int):
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=size)
        self.rank, self.size = rank, size

    def op(self, op: str, x: np.ndarray, out: np.ndarray):
        """The gloo call doing ``op``'s work on CPU tensors sharing memory with ``x`` and
        ``out`` (``torch.from_numpy``: no copy). all_reduce and broadcast work in place, on
        a copy of ``x`` made here (untimed), so that ``x`` keeps its values for ours."""
        dist, from_numpy = self.dist, self.torch.from_numpy
        t, o = from_numpy(x), from_numpy(out)
        # torch 2.13 names the tensor forms *_single (the *_tensor names warn)
        all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
        reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        if op == "cross_replica_sum":
            own = from_numpy(x.copy())
            return lambda: dist.all_reduce(own)
        if op == "all_gather":
            return lambda: all_gather(o, t)
        if op == "reduce_scatter":
            return lambda: reduce_scatter(o, t)
        if op == "all_to_all":
            return lambda: dist.all_to_all_single(o, t)
        own = from_numpy(x.copy())
        return lambda: dist.broadcast(own, 0)

    def fresh(self, op: str, x: np.ndarray, out: np.ndarray):
        """The gloo call that returns a fresh result like ours (module docstring): the
        output tensor a new ``np.empty`` shaped like ``out``; all_reduce (in place by
        nature) on a new copy of ``x``; broadcast: the root broadcasts ``x`` and copies it,
        the others receive into a new array."""
        dist, from_numpy = self.dist, self.torch.from_numpy
        shape, dtype, t = out.shape, out.dtype, from_numpy(x)
        if op == "cross_replica_sum":
            def reduce_copy():
                result = x.copy()
                dist.all_reduce(from_numpy(result))
                return result
            return reduce_copy
        if op == "broadcast":
            return _fresh_broadcast(self.rank == 0, x,
                                    lambda array: dist.broadcast(from_numpy(array), 0))
        call = {"all_gather": getattr(dist, "all_gather_single", dist.all_gather_into_tensor),
                "reduce_scatter": getattr(dist, "reduce_scatter_single",
                                          dist.reduce_scatter_tensor),
                "all_to_all": dist.all_to_all_single}[op]

        def fresh_call():
            result = np.empty(shape, dtype)
            call(from_numpy(result), t)
            return result
        return fresh_call

    def allreduce(self, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Sum ``x`` over the instances, in place (gloo's all_reduce); returns ``x``."""
        self.dist.all_reduce(self.torch.from_numpy(x))
        return x

    def barrier(self) -> None:
        self.dist.barrier()


def raw_contender(transport: str, gloo_port: int):
    if transport == "mpi":
        return RawMPI()
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    from poprun import popdist
    return RawGloo(popdist.getInstanceIndex(), popdist.getNumInstances(), gloo_port)
