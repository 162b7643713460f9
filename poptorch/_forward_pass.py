"""What one forward pass of a replica changes in its thread, and the one object that owns it.

A forward pass sets three pieces of thread state: the grad mode (on in training, off in
inference), torch's function mode stack (its :class:`~poptorch._tracing.Trace` on top, when
it intercepts every op: losses, the replica's random numbers, blocks) and the current pass
(:func:`current_pass`: what ``poptorch.identity_loss``, the block annotations and poptorch's
operations talk to). A pipelined forward pass pauses in a greenlet at each block boundary
while other passes of the same replica run in the same thread
(:mod:`poptorch.pipelining._pipeline`): :meth:`ForwardPass.pause` saves its state and puts
back the state it found, :meth:`ForwardPass.resume` puts its own back.

The invariant, checked at each pause and at the end: the pass's trace is on top of the
function mode stack (a pass whose trace intercepts nothing: the stack as deep as where it
stepped in) and the pass is the current one. A mode entered inside a block and still
active where the pass pauses would be on top instead; stepping out would drop it, so it is an
error naming it. (The replica's random generator is no thread state: each replica has its
own, :class:`poptorch._replica_rng.ReplicaRNG`.)
"""

from __future__ import annotations

import threading

import torch

from poptorch._errors import createPoptorchError

__all__ = ["ForwardPass", "current_pass"]

_thread = threading.local()


def current_pass() -> "ForwardPass | None":
    """The forward pass running in this thread (None: none)."""
    return getattr(_thread, "current", None)


class ForwardPass:
    """One forward pass's thread state (module docstring): ``with ForwardPass(...):`` enters
    it; :meth:`pause` and :meth:`resume` inside the ``with`` block step out and back in.

    Args:
        trace: the pass's :class:`~poptorch._tracing.Trace` (None: an untraced pass). It is
            pushed on torch's function mode stack when its ``intercept`` is true.
        grad: the grad mode of the pass (True: training).

    Attributes:
        trace: as given.
    """

    __slots__ = ("trace", "_mode", "_grad", "_outer_grad", "_outer_pass", "_depth")

    def __init__(self, trace=None, *, grad: bool):
        self.trace = trace
        self._mode = trace if trace is not None and trace.intercept else None
        self._grad = grad
        self._outer_grad, self._outer_pass = True, None
        self._depth = 0

    @property
    def forward(self):
        """The trace that follows the blocks (a ``StageTrace``), or None."""
        trace = self.trace
        return trace if trace is not None and trace.follows_blocks else None

    def _step_in(self) -> None:
        self._outer_grad, self._outer_pass = torch.is_grad_enabled(), current_pass()
        torch.set_grad_enabled(self._grad)
        _thread.current = self
        if self._mode is not None:
            torch._C._push_on_torch_function_stack(self._mode)
        self._depth = torch._C._len_torch_function_stack()

    def _step_out(self) -> None:
        self._check()
        if self._mode is not None:
            torch._C._pop_torch_function_stack()
        self._grad = torch.is_grad_enabled()
        _thread.current = self._outer_pass
        torch.set_grad_enabled(self._outer_grad)

    def _check(self) -> None:
        """The invariant (module docstring).

        Raises:
            poptorch.Error: another function mode is on top, or another pass is current.
        """
        depth = torch._C._len_torch_function_stack()
        top = torch._C._get_function_stack_at(depth - 1) if depth else None
        if self._mode is None and (self.trace is None or depth == self._depth):
            top = None  # (an untraced pass checks no modes; else: those around the pass)
        if top is not self._mode or current_pass() is not self:
            raise createPoptorchError(
                "A pipelined forward pass pauses at the start of a block with "
                f"{type(top).__name__ if top is not None else 'no torch function mode'} "
                "active inside it: leave every TorchFunctionMode (and poptorch context) "
                "entered in a block before the next block begins")

    def __enter__(self) -> "ForwardPass":
        self._step_in()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._step_out()
        except BaseException:  # (the mode on top is not the pass's: it stays there)
            _thread.current = self._outer_pass
            torch.set_grad_enabled(self._outer_grad)
            raise

    def pause(self) -> None:
        """Step out: the thread's state as the pass found it, until :meth:`resume` (the
        pass's grad mode, as its code left it, is kept for then).

        Raises:
            poptorch.Error: the invariant does not hold (module docstring).
        """
        self._step_out()

    def resume(self) -> None:
        """Step back in where :meth:`pause` stepped out."""
        self._step_in()
