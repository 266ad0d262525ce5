#!/usr/bin/env bash
# Installs everything fleetctl, its lab and its tests need on a Debian 12 machine (as root),
# into .venv beside this checkout. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

# postgresql: the server the tests start (in a temp dir) to run the ledger's tests on PostgreSQL too.
# openssh-server, sudo: the direct-SSH tests start sshd (a bastion and a host behind it) and use real sudo.
# chromium: the web view's test loads `fleetctl ui` in a headless browser (screenshot, console errors).
# haproxy: the front door the tests and the lab put before the nodes (driven through its runtime API).
# prometheus: promtool checks and unit-tests docs/prometheus/fleetctl-rules.yml; the metrics' lab test
# starts the server (in a temp dir, on loopback) to scrape a watch.
APT_PACKAGES=(docker.io docker-registry debootstrap openssh-client rsync iproute2 curl ca-certificates dpkg-dev gnupg
              postgresql openssh-server sudo chromium haproxy prometheus)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The distro's registry service would grab :5000 on every address; the lab runs its own.
systemctl disable --now docker-registry >/dev/null 2>&1 || true
pkill -f '^/usr/bin/docker-registry serve /etc/docker/registry/config.yml' 2>/dev/null || true
# Nor is the distro's Prometheus left running on :9090 (tests start their own): its service off,
# and one its init script started stopped by its pid file.
systemctl disable --now prometheus >/dev/null 2>&1 || true
if [ -x /etc/init.d/prometheus ]; then /etc/init.d/prometheus stop >/dev/null 2>&1 || true; fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.fleetctl-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[dev,postgres]'
  touch "$stamp"
fi
echo "bootstrap: ready ($(.venv/bin/fleetctl --version))"
