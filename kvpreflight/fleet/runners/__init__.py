"""Where deployments' checks run. One module per runner: `local` (bounded threads on this
machine), `ray` (one Ray task per batch, on the node that serves it)."""

from kvpreflight.fleet.runners.interface import Batch, Events, Runner, plan_batches

__all__ = ["Batch", "Events", "Runner", "plan_batches"]
