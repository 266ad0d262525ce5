#!/usr/bin/env python3
"""Facts of one DGX Spark, as one JSON object on stdout (Python 3 standard library only).

Run on the host, from stdin (``python3 - [options] < spark_facts.py``): the
preflight role runs it through ``ansible.builtin.command`` and ``fleetctl status``
through one SSH session, so that both read the host the same way and each pays
one round trip. It never changes anything on the host.

Gathers: the GPU (name, driver, CUDA version, compute capability, from
``nvidia-smi``), ``/etc/dgx-release``, the running kernel and the kernel the
host boots next (the newest ``/boot/vmlinuz-*``) with whether an nvidia module
exists for it, the Docker and nvidia-container-toolkit versions, free disk
under a path (``/opt``) and uptime. With ``--serving``: the serving container
(label ``fleetctl.recipe``, else ``--container NAME``) with its image, digest
and fleetctl labels, and ``/health`` of ``--port`` on the host itself.
For a rollout's preflight: ``--image REF`` (present, Docker's runtimes, free disk
under Docker's root), ``--weights PATH`` (repeated; each set's ``--marker`` file)
and ``--inspect NAME`` (repeated; each container's ``docker inspect``). Env values
of an inspected container never leave the host: only their names.
A fact that cannot be read is ``null`` with the reason under ``errors``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

ERRORS: dict[str, str] = {}
TIMEOUT = 10.0


def run(argv: list[str], timeout: float = TIMEOUT) -> tuple[int, str, str]:
    """Run a command; (rc, stdout, stderr), rc 127 when it is not installed."""
    if shutil.which(argv[0]) is None:
        return 127, "", f"{argv[0]}: command not found"
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} did not answer within {timeout:.0f}s"
    except OSError as e:
        return 126, "", f"{argv[0]}: {e}"
    return p.returncode, p.stdout, p.stderr


def first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


def version_key(v: str) -> list[tuple[int, str]]:
    """Sort key for kernel versions: numbers compare as numbers (6.8.0-1015 > 6.8.0-101)."""
    return [(int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"(\d+)", v) if p]


GPU_QUERY = ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"]


def parse_gpu(query: str, version: str = "",
              table: str = "") -> tuple[dict[str, object] | None, str | None]:
    """The ``gpu`` fact from what nvidia-smi printed: ``query`` (:data:`GPU_QUERY`), ``--version``
    and, for older drivers whose ``--version`` has no CUDA line, the plain table. Returns the fact
    and, when it is None, why."""
    rows = [[c.strip() for c in ln.split(",")] for ln in query.strip().splitlines() if ln.strip()]
    if not rows or len(rows[0]) < 3:
        return None, f"unexpected nvidia-smi output: {first_line(query)!r}"
    name, driver, cap = rows[0][:3]
    m = (re.search(r"CUDA Version\s*:\s*(\S+)", version)
         or re.search(r"CUDA Version:\s*(\S+)", table))
    return {"name": name, "driver": driver, "cuda": m.group(1) if m else None, "compute_cap": cap,
            "count": len(rows)}, None


def gpu() -> dict[str, object] | None:
    rc, out, err = run(GPU_QUERY)
    if rc != 0:
        ERRORS["gpu"] = first_line(out) or first_line(err) or f"nvidia-smi exited {rc}"
        return None
    vrc, version, _ = run(["nvidia-smi", "--version"])
    table = ""
    version = version if vrc == 0 else ""
    if not re.search(r"CUDA Version\s*:\s*\S", version):  # older drivers: only the table names it
        trc, table, _ = run(["nvidia-smi"])
        table = table if trc == 0 else ""
    fact, why = parse_gpu(out, version, table)
    if why is not None:
        ERRORS["gpu"] = why
    return fact


def dgx_release() -> dict[str, str] | None:
    try:
        with open("/etc/dgx-release", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        ERRORS["dgx_release"] = f"/etc/dgx-release: {e.strerror}"
        return None
    out = {}
    for ln in text.splitlines():
        if "=" in ln and not ln.lstrip().startswith("#"):
            k, v = ln.split("=", 1)
            out[k.strip()] = v.strip().strip('"')
    return out


def has_nvidia_module(kver: str) -> tuple[bool, str | None]:
    """Whether kernel ``kver`` has an nvidia module: a file under /lib/modules or a dpkg package."""
    base = os.path.join("/lib/modules", kver)
    for root, _dirs, files in os.walk(base):
        for f in files:
            if f.startswith("nvidia") and ".ko" in f:
                return True, os.path.join(root, f)
    # Ubuntu ships the module in linux-modules-nvidia-<branch>[-open]-<kver>; it may not be
    # unpacked yet.
    rc, out, _ = run(["dpkg-query", "-W", "-f=${Package} ${Status}\\n", "linux-modules-nvidia-*"])
    if rc == 0:
        for ln in out.splitlines():
            parts = ln.split(" ", 1)
            if parts[0].endswith("-" + kver) and "install ok installed" in ln:
                return True, parts[0]
    return False, None


def kernel() -> dict[str, object]:
    running = os.uname().release
    try:
        images = [f[len("vmlinuz-"):] for f in os.listdir("/boot") if f.startswith("vmlinuz-")]
    except OSError:
        images = []
    nxt = max(images, key=version_key) if images else running
    nxt_ok, nxt_where = has_nvidia_module(nxt)
    run_ok, _ = has_nvidia_module(running) if running != nxt else (nxt_ok, nxt_where)
    return {
        "running": running,
        "next": nxt,
        "installed": sorted(images, key=version_key),
        "next_has_nvidia": nxt_ok,
        "next_nvidia_module": nxt_where,
        "running_has_nvidia": run_ok,
    }


def docker() -> dict[str, object] | None:
    rc, out, err = run(["docker", "version", "--format", "{{.Server.Version}}"])
    if rc == 0 and out.strip():
        return {"version": out.strip(), "running": True}
    crc, cout, _ = run(["docker", "--version"])
    m = re.search(r"version\s+([0-9][^\s,]*)", cout) if crc == 0 else None
    if m is None:
        ERRORS["docker"] = first_line(err) or first_line(cout) or "docker is not installed"
        return None
    ERRORS["docker"] = f"the Docker daemon does not answer: {first_line(err)}"
    return {"version": m.group(1), "running": False}


def toolkit() -> str | None:
    # A removed (not purged) package keeps its version in dpkg's database: check the status too.
    rc, out, _ = run(
        ["dpkg-query", "-W", "-f=${db:Status-Status} ${Version}", "nvidia-container-toolkit"]
    )
    status, _, version = out.strip().partition(" ")
    if rc == 0 and status == "installed" and version:
        return version
    rc, out, _ = run(["nvidia-ctk", "--version"])
    m = re.search(r"version\s+(\S+)", out) if rc == 0 else None
    return m.group(1) if m else None


def disk(path: str, key: str = "disk") -> dict[str, object] | None:
    p = path
    while p and not os.path.exists(p):  # a not yet created /opt/x is on its parent's filesystem
        p = os.path.dirname(p.rstrip("/")) or "/"
    try:
        st = os.statvfs(p)
    except OSError as e:
        ERRORS[key] = f"{path}: {e.strerror}"
        return None
    return {"path": path, "free_gb": round(st.f_bavail * st.f_frsize / 1e9, 2),
            "total_gb": round(st.f_blocks * st.f_frsize / 1e9, 2)}


def service_manager() -> str:
    """``systemd`` when systemd runs (DGX OS), else ``service`` (SysV scripts, as in the lab).

    The names are Ansible's: the docker role hands this to ``ansible.builtin.service``'s
    ``use``, which then skips its own detection (one module run fewer).
    """
    return "systemd" if os.path.isdir("/run/systemd/system") else "service"


def uptime() -> float | None:
    try:
        with open("/proc/uptime") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def serving(container: str | None, port: int) -> dict[str, object]:
    out: dict[str, object] = {"container": None, "health": None}
    rc, ids, err = run(
        ["docker", "ps", "-a", "--filter", "label=fleetctl.recipe", "--format", "{{.ID}}"]
    )
    ids_l = ids.split()
    if rc == 0 and not ids_l and container:
        rc, ids, err = run(
            ["docker", "ps", "-a", "--filter", f"name=^/?{container}$", "--format", "{{.ID}}"]
        )
        ids_l = ids.split()
    if rc != 0:
        ERRORS["container"] = first_line(err) or f"docker ps exited {rc}"
    elif ids_l:
        rc, text, err = run(["docker", "inspect", *ids_l])
        try:
            items = json.loads(text) if rc == 0 else []
        except ValueError:
            items = []

        # The running one wins; among several, the newest. One in its restart back-off is not
        # running.
        def up(c: dict) -> bool:
            return bool(c.get("State", {}).get("Running")) and not c.get("State", {}).get(
                "Restarting"
            )

        items.sort(key=lambda c: (up(c), c.get("Created", "")), reverse=True)
        if items:
            c = items[0]
            labels = c.get("Config", {}).get("Labels") or {}
            image_id = c.get("Image", "")
            digests: list[str] = []
            rc, dtext, _ = run(
                ["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", image_id]
            )
            if rc == 0:
                try:
                    digests = json.loads(dtext) or []
                except ValueError:
                    digests = []
            ref = c.get("Config", {}).get("Image", "")
            state = c.get("State", {})
            out["container"] = {
                "name": c.get("Name", "").lstrip("/"),
                "image": ref,
                "tag": ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else None,
                "image_id": image_id,
                "digest": labels.get("fleetctl.digest")
                or (digests[0].split("@", 1)[1] if digests else None),
                "repo_digests": digests,
                "running": up(c),
                "status": state.get("Status"),
                "started_at": state.get("StartedAt"),
                "restarts": c.get("RestartCount", 0),
                "labels": {k: v for k, v in labels.items() if k.startswith("fleetctl.")},
                "others": len(items) - 1,
                "inspect": redacted(c),
            }
    t0 = time.monotonic()
    url = f"http://127.0.0.1:{port}/health"
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            code: int | None = r.status
        err_s = None
    except urllib.error.HTTPError as e:
        code, err_s = e.code, None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        code, err_s = None, str(reason)
    out["health"] = {"url": f":{port}/health", "status": code, "error": err_s,
                     "seconds": round(time.monotonic() - t0, 3)}
    if code == 200:
        out["models"] = served_models(port)
    return out


#: Largest /v1/models answer read: a list of a few names (vLLM lists each served name once).
MODELS_MAX_BYTES = 64 << 10


def served_models(port: int) -> dict[str, object]:
    """The model ids ``/v1/models`` lists (what the server says it serves), or why not (a server
    with an API key answers 401 without one: the probe has none)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=3) as r:
            body = json.loads(r.read(MODELS_MAX_BYTES + 1)[:MODELS_MAX_BYTES])
        ids = [str(m.get("id")) for m in body.get("data", []) if isinstance(m, dict)]
        return {"ids": ids[:32], "error": None}
    except urllib.error.HTTPError as e:
        return {"ids": None, "error": f"HTTP {e.code}"}
    except (urllib.error.URLError, OSError, ValueError, AttributeError) as e:
        return {"ids": None, "error": str(getattr(e, "reason", e))[:200]}


def redacted(c: dict) -> dict:
    """A ``docker inspect`` object without its env values (names kept): secrets stay on the host."""
    cfg = dict(c.get("Config") or {})
    cfg["Env"] = [str(e).split("=", 1)[0] for e in cfg.get("Env") or []]
    return {**c, "Config": cfg}


def containers(names: list[str]) -> dict[str, object]:
    """Each container named (``--inspect``): its redacted inspect and image RepoDigests, or None."""
    out: dict[str, object] = {}
    for name in names:
        rc, text, err = run(["docker", "inspect", "--type", "container", name])
        try:
            c = json.loads(text)[0] if rc == 0 else None
        except (ValueError, IndexError):
            c = None
        if c is None:
            if rc != 0 and "no such" not in (err + text).lower():
                ERRORS["containers"] = first_line(err) or f"docker inspect exited {rc}"
            out[name] = None
            continue
        rc, dtext, _ = run(["docker", "image", "inspect", "--format", "{{json .RepoDigests}}",
                            c.get("Image", "")])
        try:
            digests = (json.loads(dtext) if rc == 0 else None) or []
        except ValueError:
            digests = []
        out[name] = {"inspect": redacted(c), "repo_digests": digests}
    return out


def image_store(ref: str) -> dict[str, object]:
    """For ``--image REF``: whether REF is present, Docker's runtimes, free disk under its root."""
    rc, out, err = run(["docker", "info", "--format", "{{json .Runtimes}}\t{{.DockerRootDir}}"])
    runtimes, root = None, None
    if rc == 0 and "\t" in out:
        raw, root = out.strip().split("\t", 1)
        try:
            runtimes = sorted(json.loads(raw) or {})
        except ValueError:
            runtimes = None
    if runtimes is None:
        ERRORS["docker_runtimes"] = first_line(err) or first_line(out) or f"docker info exited {rc}"
    rc_img, _, _ = run(["docker", "image", "inspect", "--format", "{{.Id}}", ref])
    return {"ref": ref, "present": rc_img == 0, "runtimes": runtimes,
            "disk": disk(root or "/", "image_disk")}


def weight_markers(paths: list[str], marker: str) -> dict[str, object]:
    """For ``--weights PATH``: each set's stage marker (``--marker``) as JSON, None when absent."""
    out: dict[str, object] = {}
    for w in paths:
        try:
            with open(os.path.join(w, marker), encoding="utf-8") as f:
                out[w] = json.load(f)
        except FileNotFoundError:
            out[w] = None
        except (OSError, ValueError) as e:
            out[w] = f"unreadable: {e}"
    return out


def fleetctl_state(path: str) -> object:
    """The host's fleetctl state file (lock holder, target, last known-good) as stored, or None."""
    try:
        with open(path, "rb") as f:
            raw = f.read(65537)
    except FileNotFoundError:
        return None
    except OSError as e:
        ERRORS["fleetctl_state"] = f"{path}: {e.strerror}"
        return None
    if len(raw) > 65536:
        ERRORS["fleetctl_state"] = f"{path} is larger than 64 KiB"
        return None
    return raw.decode("utf-8", "replace")


def main(argv: list[str]) -> int:
    path, want_serving, container, port, state_file = "/opt", False, None, 8000, None
    image, marker = None, ".fleetctl-staged.json"
    weights: list[str] = []
    inspect: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--path":
            path, i = argv[i + 1], i + 1
        elif a == "--serving":
            want_serving = True
        elif a == "--container":
            container, i = argv[i + 1] or None, i + 1
        elif a == "--port":
            port, i = int(argv[i + 1]), i + 1
        elif a == "--state-file":
            state_file, i = argv[i + 1], i + 1
        elif a == "--image":
            image, i = argv[i + 1], i + 1
        elif a == "--marker":
            marker, i = argv[i + 1], i + 1
        elif a == "--weights":
            weights, i = [*weights, argv[i + 1]], i + 1
        elif a == "--inspect":
            inspect, i = [*inspect, argv[i + 1]], i + 1
        else:
            sys.stderr.write(f"spark_facts: unknown option {a}\n")
            return 2
        i += 1
    facts: dict[str, object] = {
        "gpu": gpu(), "dgx_release": dgx_release(), "kernel": kernel(), "docker": docker(),
        "toolkit_version": toolkit(), "disk": disk(path), "uptime_s": uptime(),
        "service_mgr": service_manager(),
    }
    if want_serving:
        facts["serving"] = serving(container, port)
    if state_file:
        facts["fleetctl_state"] = fleetctl_state(state_file)
    if image:
        facts["image"] = image_store(image)
    if weights:
        facts["weights"] = weight_markers(weights, marker)
    if inspect:
        facts["containers"] = containers(inspect)
    facts["errors"] = ERRORS
    json.dump(facts, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
