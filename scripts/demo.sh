#!/usr/bin/env bash
# Sets up everything and runs fleetctl's main job on the built-in simulated fleet (the lab).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
fleetctl lab up --nodes "${FLEETCTL_LAB_NODES:-4}"
fleetctl lab status
