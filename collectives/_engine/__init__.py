"""The collective engine, private to ``collectives``: what runs a call from the public op
(:mod:`collectives.ops`) to the transport.

* :mod:`~collectives._engine.dispatch`: a call's plan, found by its signature; a nest's
  fused buffers (:mod:`~collectives._engine.fusion`).
* :mod:`~collectives._engine.plan`: the plan of a call signature, its four steps (combine,
  agree, exchange, finish) and its two choices (carry the data in the agreement; post it
  before), and the plans of common calls, found without the argument checks of
  :mod:`~collectives._engine.arguments`; the op's steps: :mod:`~collectives._engine.reduction` (with its exchange,
  :mod:`~collectives._engine.exchange`), :mod:`~collectives._engine.movement` and
  :mod:`~collectives._engine.alltoall`, on where
  a group's replicas run (:mod:`~collectives._engine.members`) and the canonical order of a
  reduction (:mod:`~collectives._engine.tree`).
* :mod:`~collectives._engine.engine`: one instance's engine (its plans, its transport, the
  local replicas' :mod:`~collectives._engine.rendezvous`); the agreement on a call's
  :mod:`~collectives._engine.descriptor` (:mod:`~collectives._engine.agreement`); the
  records (:mod:`~collectives._engine.ledger`, :mod:`~collectives._engine.recording`); one
  engine per IPU system (:mod:`~collectives._engine.runtime`), with the process's
  :mod:`~collectives._engine.allocator` settings.

It imports the transports (:mod:`collectives.transports`), the performance model
(:mod:`collectives.performance`) and the leaf types of ``collectives`` (errors, options,
waiting, records, groups, operators), never the framework layer
(:mod:`collectives.framework`).
"""
