"""Images of the lab: the node image, the vLLM stand-in images and the CUDA check image.

Rootfs tarballs come from :mod:`fleetctl.lab.rootfs` (cached); everything on
top is a small ``docker build`` (classic builder, no RUN steps, so nothing needs
a network) whose tag carries a hash of its inputs, so a rebuild happens only
when an input changed. Tags that differ only in EMU_* settings are one ENV layer
on a shared base, so a node that pulled one pulls the next in no time.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from fleetctl.errors import FleetError
from fleetctl.lab import gpus, rootfs
from fleetctl.lab.dockerd import Dockerd
from fleetctl.lab.layout import Layout
from fleetctl.progress import NULL, Event, Progress

VLLM_REPOSITORY = "aeon-7/aeon-vllm-ultimate"
CUDA_IMAGE = "nvidia/cuda:13.0.0-base-ubuntu24.04"
KERNEL = "6.11.0-1016-nvidia"
NEWER_KERNEL = "6.11.0-1018-nvidia"


def _assets() -> Path:
    return Path(str(resources.files("fleetctl.lab") / "assets"))


def _hash_tree(paths: list[Path], extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for base in paths:
        files = sorted(p for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
            if base.is_dir() else [base]
        for f in files:
            h.update(str(f.relative_to(base.parent)).encode())
            h.update(f.read_bytes())
            h.update(str(f.stat().st_mode & 0o111).encode())
    return h.hexdigest()[:12]


def _import_rootfs(engine: Dockerd, spec: rootfs.RootfsSpec, progress: Progress) -> str:
    ref = f"fleetctl-lab/{spec.name}-base:{spec.key()}"
    if engine.image_exists(ref):
        return ref
    tar = rootfs.tarball(spec, progress)
    progress(Event("importing", f"{spec.name} rootfs into the lab engine as {ref}"))
    with tar.open("rb") as f:
        data = f.read()
    engine.docker("import", "-c", 'CMD ["/bin/bash"]', "-", ref, input=data, timeout=600,
                  what=f"importing the {spec.name} rootfs")
    return ref


def _context(layout: Layout, name: str) -> Path:
    """An empty build context directory (what a previous build left is removed)."""
    ctx = layout.build_dir / name
    if ctx.exists():
        shutil.rmtree(ctx)
    ctx.mkdir(parents=True)
    return ctx


def _build(engine: Dockerd, context: Path, ref: str, progress: Progress, what: str) -> str:
    progress(Event("building", f"{what} ({ref})"))
    engine.docker("build", "--network", "none", "-q", "-t", ref, str(context), timeout=600,
                  what=f"building {what}")
    return ref


def node_image(layout: Layout, engine: Dockerd, progress: Progress = NULL) -> str:
    """The node image (built if its inputs changed): Debian + Docker + sshd + the GPU stand-ins."""
    base = _import_rootfs(engine, rootfs.NODE, progress)
    node_assets = _assets() / "node"
    ref = f"fleetctl-lab/node:{_hash_tree([node_assets], base + json.dumps(gpus.DEFAULT))}"
    if engine.image_exists(ref):
        return ref
    ctx = _context(layout, "node")
    files = ctx / "files"
    lib = files / "usr" / "lib" / "fleetctl-lab"
    lib.mkdir(parents=True)
    for name in ("nvidia-smi", "nvidia-smi-q.template"):
        shutil.copy2(node_assets / name, lib / name)
    (lib / "nvidia-smi").chmod(0o755)
    (files / "usr" / "bin").mkdir(parents=True)
    (files / "usr" / "bin" / "nvidia-smi").symlink_to("/usr/lib/fleetctl-lab/nvidia-smi")
    sbin = files / "usr" / "local" / "sbin"
    sbin.mkdir(parents=True)
    shutil.copy2(node_assets / "entry.sh", sbin / "fleetctl-node-entry")
    (sbin / "fleetctl-node-entry").chmod(0o755)
    etc = files / "etc"
    (etc / "docker").mkdir(parents=True)
    shutil.copy2(node_assets / "daemon.json", etc / "docker" / "daemon.json")
    (etc / "default").mkdir()
    shutil.copy2(node_assets / "docker.default", etc / "default" / "docker")
    shutil.copy2(node_assets / "dgx-release", etc / "dgx-release")
    for rel, text in gpus.files(gpus.DEFAULT).items():
        p = files / rel.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    # The kernel a Spark boots, with the NVIDIA module built for it (DKMS-style path).
    (files / "boot").mkdir()
    (files / "boot" / f"vmlinuz-{KERNEL}").write_bytes(b"fleetctl lab stand-in kernel image\n")
    (files / "boot" / f"initrd.img-{KERNEL}").write_bytes(b"fleetctl lab stand-in initrd\n")
    mod = files / "usr" / "lib" / "modules" / KERNEL / "kernel" / "nvidia-580"
    mod.mkdir(parents=True)
    (mod / "nvidia.ko").write_bytes(b"fleetctl lab stand-in nvidia module\n")
    (ctx / "Dockerfile").write_text(
        f"FROM {base}\n"
        "COPY files/ /\n"
        'CMD ["/usr/local/sbin/fleetctl-node-entry"]\n'
    )
    return _build(engine, ctx, ref, progress, "the node image")


def python_base(engine: Dockerd, progress: Progress = NULL) -> str:
    """The python-only base image in the lab engine (imported from the cached rootfs if needed)."""
    return _import_rootfs(engine, rootfs.PYTHON, progress)


def _emulator_dir() -> Path:
    return Path(str(resources.files("fleetctl.lab") / "emulator"))


def vllm_base(layout: Layout, engine: Dockerd, progress: Progress = NULL) -> str:
    """The shared base of every vLLM stand-in tag: python3 + the emulator as ``vllm``."""
    base = python_base(engine, progress)
    emu = _emulator_dir()
    if not (emu / "vllm").exists() or importlib.util.find_spec("fleetctl.lab.scenarios") is None:
        raise FleetError(
            f"the vLLM emulator is not in this checkout ({emu}/vllm is missing)",
            fix="update the checkout (the emulator lives in fleetctl/lab/emulator)",
        )
    ref = f"fleetctl-lab/vllm-base:{_hash_tree([emu, emu.parent / 'scenarios.py'], base)}"
    if engine.image_exists(ref):
        return ref
    ctx = _context(layout, "vllm-base")
    # Only the emulator goes in (not the rest of fleetctl), the way the emulator's
    # own installer lays it out, with its `vllm` command on PATH.
    from fleetctl.lab import scenarios

    scenarios.install_emulator(ctx / "files")
    (ctx / "Dockerfile").write_text(
        f"FROM {base}\n"
        "COPY files/ /\n"
        "ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1\n"
        'ENTRYPOINT ["vllm"]\n'
    )
    return _build(engine, ctx, ref, progress, "the vLLM emulator base image")


def _dockerfile_env(settings: Mapping[str, str]) -> str:
    lines = [f"ENV {k}={json.dumps(str(v))}" for k, v in sorted(settings.items())]
    return "\n".join(lines) + ("\n" if lines else "")


def build_tag(
    layout: Layout,
    engine: Dockerd,
    ref: str,
    settings: Mapping[str, str],
    progress: Progress = NULL,
    from_dir: Path | None = None,
    cmd: list[str] | None = None,
) -> str:
    """Build ``ref`` (a full registry reference) from the emulator base plus ``settings``, or from
    a directory."""
    ctx = _context(layout, "tags/" + hashlib.sha256(ref.encode()).hexdigest()[:12])
    if from_dir is not None:
        if not from_dir.is_dir():
            raise FleetError(
                f"--from-dir {from_dir} is not a directory",
                fix="pass a directory to copy into the image",
            )
        shutil.copytree(from_dir, ctx / "app", ignore=shutil.ignore_patterns("__pycache__"))
        entry = json.dumps(cmd) if cmd else '["/bin/sh"]'
        text = f"FROM {python_base(engine, progress)}\nCOPY app/ /app/\nWORKDIR /app\n"
        text += f"ENTRYPOINT {entry}\n" + _dockerfile_env(settings)
    else:
        text = f"FROM {vllm_base(layout, engine, progress)}\n"
        if cmd:
            text += f"ENTRYPOINT {json.dumps(cmd)}\n"
        # ENV last: tags that differ only in settings share every other layer.
        text += _dockerfile_env(settings)
    (ctx / "Dockerfile").write_text(text)
    _build(engine, ctx, ref, progress, f"image {ref.split('/', 1)[1]}")
    return ref


def cuda_image(layout: Layout, engine: Dockerd, ref: str, progress: Progress = NULL) -> str:
    """A small stand-in of NVIDIA's CUDA base image: nvidia-smi appears only with --gpus (the hook
    injects it)."""
    base = python_base(engine, progress)
    ctx = _context(layout, "cuda")
    (ctx / "Dockerfile").write_text(
        f"FROM {base}\n"
        "ENV NVARCH=x86_64 CUDA_VERSION=13.0.0 NVIDIA_REQUIRE_CUDA=cuda>=13.0 "
        "NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility\n"
        'LABEL maintainer="fleetctl lab (stand-in of NVIDIA CORPORATION <cudatools@nvidia.com>)"\n'
        'CMD ["/bin/bash"]\n'
    )
    return _build(engine, ctx, ref, progress, "the CUDA check image")


#: The repository and tag of the image relay (fleetctl.rollout.imagetree's default ``relay_image``,
#: docker.io/library/registry:2, which the lab's mirror mapping sends to the lab registry).
RELAY_IMAGE = "library/registry:2"


def relay_image(layout: Layout, engine: Dockerd, ref: str, progress: Progress = NULL) -> str:
    """The image relay: this machine's ``docker-registry`` (Debian's distribution 2.8, the lab
    registry's
    own binary) on the python base, serving ``/var/lib/registry`` on :5000 unless told otherwise."""
    binary = shutil.which("docker-registry")
    if binary is None:
        raise FleetError(
            "docker-registry is not installed",
            fix="run scripts/bootstrap.sh (apt-get install docker-registry)",
        )
    ctx = _context(layout, "relay")
    shutil.copy2(binary, ctx / "registry")
    (ctx / "config.yml").write_text(
        "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: /var/lib/registry\n"
        "http:\n  addr: :5000\n"
    )
    (ctx / "Dockerfile").write_text(
        f"FROM {python_base(engine, progress)}\n"
        "COPY registry /usr/bin/registry\n"
        "COPY config.yml /etc/docker/registry/config.yml\n"
        'ENTRYPOINT ["/usr/bin/registry"]\n'
        'CMD ["serve", "/etc/docker/registry/config.yml"]\n'
    )
    return _build(engine, ctx, ref, progress, "the image relay (distribution)")


def push(engine: Dockerd, ref: str, progress: Progress = NULL) -> None:
    """Push ``ref`` to the lab registry."""
    progress(Event("pushing", ref))
    engine.docker("push", "-q", ref, timeout=600, what=f"pushing {ref}")


@dataclass(frozen=True)
class TagSpec:
    """One image tag ``lab up`` pushes: ``repository:tag``, its EMU_* settings, its entrypoint."""

    ref: str
    env: Mapping[str, str]
    entrypoint: tuple[str, ...] = ("vllm",)


def default_tags() -> list[TagSpec]:
    """The tags of the emulator's release-history table
    (``fleetctl.lab.scenarios.history_tags``)."""
    from fleetctl.lab import scenarios

    return [
        TagSpec(ref=t.ref, env=dict(t.env), entrypoint=tuple(t.entrypoint))
        for t in scenarios.history_tags()
    ]
