"""Side by side: while a host's gate soaks the new version, the reference set's greedy prompts also
go to one host of the same rollout still on the old version, so that the known_good check holds
even where the ledger has no known-good set for the recipe yet (a first rollout under fleetctl).

The peer is a host of the same rollout (so the same recipe) whose step has not started
(``pending`` in the ledger) and that serves another digest than the target, not a unit's member
(a unit serves from its head only); chosen by the gated host's name among them, so that a wave's
gates spread over the old hosts. One peer per gate, its requests the set's own (about ten, at the
set's concurrency, each bounded by the soak's request timeout). It serves users meanwhile: its
answers are compared, never judged on their own.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

from fleetctl import secretenv
from fleetctl.inventory import Host, Inventory
from fleetctl.recipes import Recipe
from fleetctl.soak.answerset import ReferenceSet
from fleetctl.soak.config import SoakConfig
from fleetctl.soak.phases.answer_set import collect
from fleetctl.soak.verdict import SoakTarget
from fleetctl.state.ledger import Ledger
from fleetctl.state.records import PENDING


def peer(ledger: Ledger, inv: Inventory, rollout_id: str, host: str
         ) -> tuple[Host, str, str] | None:
    """(host, tag, digest) of the old-version host ``host``'s gate asks, or None when there is
    none."""
    try:
        rec = ledger.get(rollout_id)
    except Exception:  # not a rollout of this ledger (a soak outside a rollout): no peer
        return None
    target = rec.digest or ""
    olds = sorted((h for h in rec.hosts if h.status == PENDING and h.host != host
                   and h.before_digest and h.before_digest != target
                   and inv.unit_of(h.host) is None), key=lambda h: h.host)
    if not olds:
        return None
    pick = olds[zlib.crc32(host.encode()) % len(olds)]
    return inv.host(pick.host), pick.before_tag or "", pick.before_digest or ""


def ask(peer_host: Host, tag: str, digest: str, recipe: Recipe, cfg: SoakConfig,
        secrets: Mapping[str, str] | None) -> ReferenceSet:
    """The reference set as ``peer_host`` (still on ``tag``) answers it."""
    key = secretenv.api_key(recipe.secret_env, secrets, recipe=recipe.name)
    target = SoakTarget(peer_host.name, f"http://{peer_host.address}:{recipe.port}", None, tag,
                        api_key=key, digest=digest)
    answers = collect(target, cfg)
    return ReferenceSet(answers, tag=tag, digest=digest, recipe=recipe.name, host=peer_host.name,
                        fingerprint=cfg.fingerprint(), source="side-by-side",
                        run_id=f"side-by-side on {peer_host.name}")


def find(store: object, inv: Inventory | None, run_id: str, host: Host,
         cfg: SoakConfig) -> tuple[Host, str, str] | None:
    """The peer ``host``'s gate asks (see :func:`peer`), or None: no fleet, no ledger, no
    known-good check enabled, or no host left on the old version."""
    if inv is None or not isinstance(store, Ledger) or not cfg.check("known_good").enabled:
        return None
    return peer(store, inv, run_id.split("/")[0], host.name)
