#!/bin/bash
# Main process of a lab Spark (or of the lab's bastion): the admin user, sshd and, on a
# Spark, Debian's docker service; then wait. Set by `fleetctl lab up` (see fleetctl/lab/access.py):
#   FLEETCTL_LAB_ROLE          node | bastion
#   FLEETCTL_LAB_ADMIN         the admin user who logs in with the lab's key (root never does)
#   FLEETCTL_LAB_SUDO          nopasswd | password (from /etc/fleetctl-lab/sudo-password) | none
#   FLEETCTL_LAB_DOCKER_GROUP  1: the admin user is in the docker group
#   FLEETCTL_LAB_DENY_SSH_FROM the controller's address, refused on port 22 (reached through the bastion)
#   FLEETCTL_LAB_SSH_ROUTE     the one address fleetctl's connections come from (a node: the bastion's;
#                              the bastion: the controller's), exempt from sshd's PerSourcePenalties
# Host keys are made here, at first start, so that every node has its own.
set -u
ROLE=${FLEETCTL_LAB_ROLE:-node}
ADMIN=${FLEETCTL_LAB_ADMIN:-nvidia}
mkdir -p /run/sshd /var/log
if [ ! -s /etc/ssh/ssh_host_ed25519_key ]; then
  ssh-keygen -q -A
fi

# The admin user: a home, the lab's key, no usable password unless sudo asks for one.
if ! id "$ADMIN" >/dev/null 2>&1; then
  useradd -m -s /bin/bash -u 1000 "$ADMIN"
fi
install -d -m 700 -o "$ADMIN" -g "$ADMIN" "/home/$ADMIN/.ssh"
if [ ! -s "/home/$ADMIN/.ssh/authorized_keys" ]; then
  # Only at first start: fleetctl adds (and removes) its own lines later (weights staging keys).
  install -m 600 -o "$ADMIN" -g "$ADMIN" /etc/fleetctl-lab/authorized_keys "/home/$ADMIN/.ssh/authorized_keys"
fi
rm -f /etc/sudoers.d/90-fleetctl-lab
case "${FLEETCTL_LAB_SUDO:-none}" in
  nopasswd)
    usermod -p '*' "$ADMIN"
    echo "$ADMIN ALL=(ALL:ALL) NOPASSWD: ALL" > /etc/sudoers.d/90-fleetctl-lab ;;
  password)
    printf '%s:%s\n' "$ADMIN" "$(cat /etc/fleetctl-lab/sudo-password)" | chpasswd
    echo "$ADMIN ALL=(ALL:ALL) ALL" > /etc/sudoers.d/90-fleetctl-lab ;;
  *)
    usermod -p '*' "$ADMIN" ;;
esac
[ -f /etc/sudoers.d/90-fleetctl-lab ] && chmod 440 /etc/sudoers.d/90-fleetctl-lab
if [ "${FLEETCTL_LAB_DOCKER_GROUP:-0}" = 1 ]; then
  usermod -aG docker "$ADMIN" 2>/dev/null || true
else
  gpasswd -d "$ADMIN" docker >/dev/null 2>&1 || true
fi

cat > /etc/ssh/sshd_config.d/fleetctl-lab.conf <<EOF
PermitRootLogin no
PasswordAuthentication no
KbdInteractiveAuthentication no
EOF
if [ -n "${FLEETCTL_LAB_SSH_ROUTE:-}" ]; then
  # OpenSSH 9.8+ refuses an address for a while once its connections that never authenticated add
  # up (PerSourcePenalties noauth:1 min:15): every connection to a node comes from the bastion's
  # one address, so the connections a paused or overloaded node left unauthenticated (timed out
  # by the controller, then accepted from the backlog) shut the whole route to it ("Not allowed at
  # this time"). docs/security.md says the same for a real fleet behind a jump host.
  echo "PerSourcePenaltyExemptList $FLEETCTL_LAB_SSH_ROUTE" >> /etc/ssh/sshd_config.d/fleetctl-lab.conf
fi
if [ "$ROLE" = bastion ]; then
  # A bastion forwards connections (ProxyJump) and runs nothing else.
  printf 'AllowTcpForwarding yes\nMaxStartups 100:30:200\n' >> /etc/ssh/sshd_config.d/fleetctl-lab.conf
fi
if [ -n "${FLEETCTL_LAB_DENY_SSH_FROM:-}" ]; then
  rule=(INPUT -p tcp --dport 22 -s "$FLEETCTL_LAB_DENY_SSH_FROM" -j REJECT --reject-with tcp-reset)
  iptables -C "${rule[@]}" 2>/dev/null || iptables -I "${rule[@]}"
fi
/usr/sbin/sshd -E /var/log/sshd.log
if [ "$ROLE" != bastion ]; then
  service docker start >/var/log/docker-service.log 2>&1
fi
touch /run/fleetctl-lab-ready
# PID 1 ignores SIGTERM by default: stop on it explicitly so `docker stop` is quick.
trap 'service docker stop >/dev/null 2>&1; exit 0' TERM INT
while :; do sleep 3600 & wait $!; done
