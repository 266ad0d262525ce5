#!/usr/bin/env bash
# Sets up everything and runs fleetctl's main job on the built-in simulated fleet (the lab):
# a simulated fleet of DGX Sparks, provisioned, weights staged, serving v0.23.0, then rolled to
# v0.24.0 canary-first with a soak gate on every host.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
# Short soaks: the lab's emulator judges in seconds what a Spark needs minutes for.
SOAK="${FLEETCTL_DEMO_SOAK:-10s}"

fleetctl lab up --nodes "${FLEETCTL_LAB_NODES:-4}"
# The lab is reached as a real fleet is: an admin user whose sudo password (on one node) is
# vault-encrypted in the inventory; this gives fleetctl the vault password, as an operator's
# ANSIBLE_VAULT_PASSWORD_FILE (or --vault-password-file) would.
eval "$(fleetctl lab env)"
fleetctl provision
fleetctl stage
# The first deploy: the fleet serves nothing yet, so the "rollout" to v0.23.0 starts each host
# fresh (all at once: nothing is in service to protect). It is a no-op when already serving it.
fleetctl rollout --tag v0.23.0 --waves 100% --max-unavailable 100% --soak "$SOAK" --yes
fleetctl status
# The main job: canary first, then the rest, each gated by its soak; a failed gate rolls back.
fleetctl rollout --tag v0.24.0 --soak "$SOAK" --yes
fleetctl status
fleetctl history
