"""The gate's checks: evidence from one soak in, one CheckResult per check out.

Each check turns its evidence into measurements (one per level, window, class
or prompt), each pass / fail / inconclusive / error with the measured value and
its bound, then applies the check's limits as Argo Rollouts' analysis does:
more failures than ``failure_limit`` fails it, more consecutive errors than
``consecutive_error_limit`` errors it, more inconclusive measurements than
``inconclusive_limit`` makes it inconclusive. No measurements at all is
inconclusive: missing data never passes. ``observe_only`` checks are reported
but do not count toward the verdict.

The modules, each one concept: ``check`` (the :class:`~fleetctl.soak.checks.check.Check` type,
its context, the probes, the registry type), ``registry`` (THE registry: the built-in checks in
report order, one line each, and ``evaluate``), ``evidence`` (what a soak observed), ``judge``
(the outcome rules and the doubts all families share), and the families: ``health``,
``answers``, ``performance``, ``speculative`` and ``known_good``. Import each name from its
module.
"""
