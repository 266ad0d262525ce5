#!/usr/bin/env bash
# Sets up everything and runs fleetctl's main job on the built-in simulated fleet (the lab):
# a simulated fleet of DGX Sparks that serves two models, provisioned, each host's weights staged,
# serving v0.23.0, then rolled to v0.24.0 canary-first with a soak gate on every host, each host
# on its OWN model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
# Short soaks: the lab's emulator judges in seconds what a Spark needs minutes for.
SOAK="${FLEETCTL_DEMO_SOAK:-10s}"
NODES="${FLEETCTL_LAB_NODES:-4}"
# The second model: the last two nodes serve it (the others the inventory's default recipe,
# qwen36-35b-heretic). An operator writes the same in host_vars/<host>/recipe.yml (or a group's
# group_vars): `fleetctl_recipe: qwen36-27b-mm`; `lab up --recipe` writes exactly that file.
SECOND="${FLEETCTL_DEMO_RECIPE:-qwen36-27b-mm}"
OTHERS="spark-$(printf %02d $((NODES - 1))),spark-$(printf %02d "$NODES")"

fleetctl lab up --nodes "$NODES" --recipe "$OTHERS=$SECOND"
# The lab is reached as a real fleet is: an admin user whose sudo password (on one node) is
# vault-encrypted in the inventory. The lab's inventory keeps an ansible.cfg naming its vault
# password file beside it, so fleetctl (and a new shell) needs no ANSIBLE_VAULT_PASSWORD_FILE.
fleetctl provision
# Each host's own recipe's weights: one tree of copies per recipe.
fleetctl stage
# The first deploy: the fleet serves nothing yet, so the "rollout" to v0.23.0 starts each host
# fresh (all at once: nothing is in service to protect), each on its own recipe. A no-op when
# already serving it; --switch-model: a lab an earlier run left serving other models is put on
# the recipes above (a switch is never made without it).
fleetctl rollout --tag v0.23.0 --waves 100% --max-unavailable 100% --soak "$SOAK" --yes \
    --switch-model
fleetctl status
# The main job: each recipe's hosts canary first, then the rest, each gated by its soak; every
# host stays on its own model; a failed gate rolls back.
fleetctl rollout --tag v0.24.0 --soak "$SOAK" --yes
fleetctl status
fleetctl history
# What the demo claims, checked: every host serves its own recipe (no drift) at v0.24.0.
fleetctl status --json | python3 -c '
import json, sys
hosts = json.load(sys.stdin)
bad = {n: h.get("drift") or (h.get("container") or {}).get("tag")
       for n, h in hosts.items()
       if h.get("drift") or "v0.24.0" not in str((h.get("container") or {}).get("tag"))}
recipes = sorted({str(h.get("recipe")) for h in hosts.values()})
names = ", ".join(recipes)
verdict = "each serves its own at v0.24.0" if not bad else f"NOT as expected: {bad}"
print(f"{len(hosts)} hosts on {len(recipes)} recipes ({names}): {verdict}")
sys.exit(1 if bad else 0)'
