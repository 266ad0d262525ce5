"""``fleetctl watch --remediate``: a breach heals itself (drain, restart, re-gate, re-admit), with
a circuit breaker per host and per recipe that rolls a host back to its known-good or parks it.

``policy.py`` reads a recipe's ``watch:`` policy, ``breaker.py`` counts remediations in a window,
``heal.py`` does one host's remediation through the rollout engine's seams, ``record.py`` keeps it
in the ledger. docs/watch.md says what is remediated and how it is bounded.
"""
