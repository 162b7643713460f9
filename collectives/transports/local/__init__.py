"""The local transport: a single instance, no network
(:mod:`~collectives.transports.local.transport`)."""
