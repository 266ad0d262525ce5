"""The rollout commands as one object: ``Engine`` stacks the verbs (the order is in ``session``)."""

from __future__ import annotations

from fleetctl.rollout.resume import Resume


class Engine(Resume):
    """Runs rollouts and rollbacks for one inventory, recording everything in its ledger."""

