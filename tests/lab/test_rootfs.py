"""The rootfs cache key: any change to what goes into a tarball names a new one."""

from __future__ import annotations

import dataclasses

from fleetctl.lab import rootfs


def test_key_follows_the_package_list() -> None:
    base = rootfs.NODE
    assert (
        base.key() == dataclasses.replace(base, packages=tuple(reversed(base.packages))).key()
    )  # order-free
    assert base.key() != dataclasses.replace(base, packages=(*base.packages, "kmod")).key()
    assert base.key() != dataclasses.replace(base, strip=()).key()
    assert rootfs.NODE.key() != rootfs.PYTHON.key()


def test_node_rootfs_has_what_the_roles_need() -> None:
    needed = {
        "python3",
        "python3-apt",
        "openssh-server",
        "docker.io",
        "docker-cli",
        "rsync",
        "curl",
        "gpg",
        "init-system-helpers",
        "sysvinit-utils",
        "iproute2",
        "sudo",
        "ca-certificates",
    }
    assert needed <= set(rootfs.NODE.packages)
    assert rootfs.PYTHON.packages == ("python3",)
