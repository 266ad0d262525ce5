#!/bin/bash
# Main process of a lab Spark: sshd and Debian's docker service, then wait.
# Host keys are made here, at first start, so that every node has its own.
set -u
mkdir -p /run/sshd /root/.ssh /var/log
chmod 700 /root/.ssh
if [ ! -s /etc/ssh/ssh_host_ed25519_key ]; then
  ssh-keygen -q -A
fi
install -m 600 /etc/fleetctl-lab/authorized_keys /root/.ssh/authorized_keys
/usr/sbin/sshd -E /var/log/sshd.log
service docker start >/var/log/docker-service.log 2>&1
touch /run/fleetctl-lab-ready
# PID 1 ignores SIGTERM by default: stop on it explicitly so `docker stop` is quick.
trap 'service docker stop >/dev/null 2>&1; exit 0' TERM INT
while :; do sleep 3600 & wait $!; done
