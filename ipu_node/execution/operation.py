"""``Operation``: the stand-in for a TF op that has side effects and no value.

TF-IPU functions such as ``IPUOutfeedQueue.enqueue`` return an Operation that a loop body
returns after its tensors [004:420]. ipupod runs eagerly, so the effect has already happened
when the Operation is returned; it only marks "no value here" for loops and compile.
"""

from __future__ import annotations

__all__ = ["Operation"]


class Operation:
    """A side effect that has already run (eager). ``name`` says what it was."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def run(self) -> None:
        """Nothing to do: the effect ran when the Operation was made."""

    def __repr__(self) -> str:
        return f"<Operation {self.name}>"
