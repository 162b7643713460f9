"""Graphcore's efficient-data-loading tutorial's pattern: several ``poptorch.DataLoader``
objects in Async mode with worker processes, one after another, each iterated over one epoch
and dropped (``python -m tests.programs.poptorch_loaders``). Prints ``batches=<n>`` per
loader and ``children=<n>`` at the end (the loaders' worker processes still alive)."""

import multiprocessing
import threading
import time

import torch

import poptorch


class Images(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        return torch.full((3, 4, 4), float(index)), index % 10


def main() -> None:
    for workers in (1, 2, 1, 2):
        opts = poptorch.Options().deviceIterations(2)
        loader = poptorch.DataLoader(opts, Images(), batch_size=4, num_workers=workers,
                                     mode=poptorch.DataLoaderMode.Async)
        batches = sum(1 for _ in loader)
        print(f"batches={batches}", flush=True)
    del loader
    deadline = time.monotonic() + 30   # (a worker thread may hold the last reference)
    while any(t.name == "poptorch-async-loader" for t in threading.enumerate()) and \
            time.monotonic() < deadline:
        time.sleep(0.01)
    print(f"children={len(multiprocessing.active_children())}", flush=True)


if __name__ == "__main__":
    main()
