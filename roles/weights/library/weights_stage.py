#!/usr/bin/python3
"""Ansible module: the host side of staging model weights into /opt, atomically.

Python's standard library only. One module with three steps, each safe to
re-run, so that a staging killed at any point leaves the previous weights in
place and the next run completes:

``preflight``
    Decides, per weight set, whether the staged directory is already current
    (its ``.fleetctl-staged.json`` marker names the same repository, revision
    and manifest, and every file it lists is there with its size); removes
    staging directories left by killed runs; checks free disk for every set
    that must be staged plus headroom, before any byte moves.
``fetch``
    Downloads into ``<path>.staging-<run>`` beside the target: from a mirror
    (``<mirror>/<repo>/<revision>/manifest.json`` lists the files; each is
    sha256-checked while it streams) or from the hub (``hf download``, the
    token passed in the environment, never on a command line or in a result).
``swap``
    Writes the marker into the verified staging directory and exchanges it
    with the target in one ``renameat2(RENAME_EXCHANGE)``: there is no instant
    without a directory at the path, and a container that bind-mounted the old
    directory keeps its files. The old set is then removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import glob
import hashlib
import http.client
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

DOCUMENTATION = r"""
module: weights_stage
short_description: Preflight, fetch and atomically swap model weight sets under /opt
options:
  step: {description: preflight, fetch, receive or swap., type: str, required: true, choices: [preflight, fetch, receive, swap]}
  seed: {description: "For receive: {address, port, user} of the seed host.", type: dict}
  key: {description: For receive, this run's private key (no_log)., type: str}
  known_hosts: {description: For receive, the seed's verified host key lines., type: str}
  timeout: {description: Seconds each rsync may take., type: int, default: 3600}
  sets: {description: "Weight sets: [{role, repo, revision, path, size_gb}].", type: list, elements: dict, required: true}
  run: {description: Run id naming the staging directories., type: str, required: true}
  source: {description: mirror, hub or local (a controller directory the role rsyncs)., type: str, default: mirror}
  mirror: {description: Base URL of the weights mirror., type: str}
  hub_endpoint: {description: The hub's base URL., type: str, default: https://huggingface.co}
  token: {description: Hub token (no_log)., type: str}
  headroom_gb: {description: Free space to keep beyond the new weights., type: float, default: 5}
  only: {description: Roles to act on (default all)., type: list, elements: str}
"""  # noqa: E501 (data: lines as the program reads them)

MARKER = ".fleetctl-staged.json"
#: Where a receiver keeps the run's copy key while rsync runs (tmpfs: gone at reboot at the latest).
KEY_BASE = "/run"
SOURCE = ".fleetctl-source.json"
MANIFEST = ".fleetctl-manifest.json"
GB = 1000**3
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
#: Seconds a mirror/hub request may take before the step fails (bounded waits).
HTTP_TIMEOUT = 60
#: Largest JSON answer (manifest, hub API) read: a manifest of thousands of files is < 1 MB.
MAX_JSON = 16 * 1024 * 1024
#: Slowest transfer a download may fall to on average before it is cut off (bytes per second):
#: a file of N bytes gets HTTP_TIMEOUT + N / MIN_RATE seconds in all, whatever the idle timeout.
MIN_RATE = 1024 * 1024


class StageError(Exception):
    """A step cannot go on; the message names the cause and the fix."""


def staging_dir(path, run):
    """Where a run stages a set: beside the target, on the same filesystem (so rename works)."""
    return f"{path}.staging-{run}"


def read_json(path):
    """A JSON file's content, or None when it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class _KeepTokenHome(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but the hub token goes to the hub only.

    urllib copies every header to the redirect's target: a hub answering 302 to
    a CDN, another host or plain http would hand the token over. It is dropped
    on any change of host or port and on https -> http; a redirect to anything
    but http(s) is refused.
    """

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is None:
            return None
        old, to = urllib.parse.urlsplit(req.full_url), urllib.parse.urlsplit(new.full_url)
        if to.scheme not in ("http", "https"):
            raise StageError(
                f"{_safe(req.full_url)} redirected to a {to.scheme or 'relative'} URL; only "
                "http(s) is followed"
            )
        if _origin(old)[1:] != _origin(to)[1:] or (old.scheme == "https" and to.scheme == "http"):
            new.remove_header("Authorization")
        return new


def _origin(p):
    return p.scheme, (p.hostname or "").lower(), p.port or {"http": 80, "https": 443}.get(p.scheme)


_OPENER = urllib.request.build_opener(_KeepTokenHome)


def _http_json(url, token=None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with _OPENER.open(req, timeout=HTTP_TIMEOUT) as r:
            raw = _read_capped(r, url, MAX_JSON, time.monotonic() + HTTP_TIMEOUT)
    except urllib.error.HTTPError as e:
        raise StageError(f"{_safe(url)} answered HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        raise StageError(f"cannot reach {_safe(url)} ({getattr(e, 'reason', e)})") from None
    try:
        return json.loads(raw), raw
    except ValueError:
        raise StageError(f"{_safe(url)} did not return JSON") from None


def _read_capped(r, url, limit, end, sink=None):
    """Read ``r`` to its end, at most ``limit`` bytes and before ``end`` (monotonic); into ``sink``
    if given."""
    read = getattr(r, "read1", r.read)  # what has arrived: read(n) waits for n bytes of a trickle
    parts: list[bytes] = []
    got = 0
    while True:
        if time.monotonic() > end:
            raise StageError(
                f"{_safe(url)} did not finish within its deadline ({got} bytes so far); "
                "check the mirror's health"
            )
        chunk = read(min(1 << 20, limit + 1 - got))
        if not chunk:
            return b"".join(parts)
        got += len(chunk)
        if got > limit:
            raise StageError(f"{_safe(url)} sent more than the {limit} bytes expected")
        if sink is None:
            parts.append(chunk)
        else:
            sink(chunk)


def _safe(url):
    """A URL without any credentials in it, for messages."""
    p = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(
        (
            p.scheme,
            p.hostname + (f":{p.port}" if p.port else "") if p.hostname else "",
            p.path,
            "",
            "",
        )
    )


def source_info(s, source, mirror, hub_endpoint, token):
    """What the source says about a set: bytes, manifest (mirror), commit and revision date."""
    if source == "mirror":
        if not mirror:
            raise StageError("source is mirror but no fleetctl_weights_mirror is set")
        url = f"{mirror.rstrip('/')}/{s['repo']}/{s['revision']}/manifest.json"
        manifest, raw = _http_json(url)
        got = hashlib.sha256(raw).hexdigest()
        pin = s.get("manifest_sha256")
        if pin and got != pin:
            # The manifest carries every file's sha256: pinned out of band (the recipe), it is what
            # makes a plain-http mirror trustworthy. A different one is another set of bytes.
            raise StageError(
                f"{_safe(url)} has sha256 {got}, not the recipe's manifest_sha256 {pin}: "
                "the mirror serves other bytes than were pinned (tampered, or re-published)"
            )
        files = manifest.get("files") if isinstance(manifest, dict) else None
        if not isinstance(files, list):
            raise StageError(f"{url} has no files list")
        return {
            "bytes": sum(int(f.get("size", 0)) for f in files),
            "manifest": manifest,
            "manifest_sha256": got,
            "commit": manifest.get("commit") or s["revision"],
            "revision_date": manifest.get("revision_date"),
            "url": url.rsplit("/", 1)[0],
        }
    if source == "local":
        # A directory on the controller, copied by the role with rsync (symlinks kept as they are,
        # so that verification sees what an operator's download really holds); sizes are the
        # recipe's.
        return {
            "bytes": int(float(s.get("size_gb") or 0) * GB),
            "manifest": None,
            "manifest_sha256": None,
            "commit": s["revision"],
            "revision_date": None,
        }
    revision = urllib.parse.quote(s["revision"], safe="")
    url = f"{hub_endpoint.rstrip('/')}/api/models/{s['repo']}/revision/{revision}"
    info, _ = _http_json(url, token)
    return {
        "bytes": int(float(s.get("size_gb") or 0) * GB),
        "manifest": None,
        "manifest_sha256": None,
        "commit": info.get("sha") or s["revision"],
        "revision_date": (info.get("lastModified") or "")[:10] or None,
    }


def is_current(s, info):
    """True when the staged directory already holds exactly this revision, complete."""
    marker = read_json(os.path.join(s["path"], MARKER))
    if not isinstance(marker, dict):
        return False, "not staged yet" if not os.path.exists(s["path"]) else "no fleetctl marker"
    for k in ("repo", "revision", "commit", "manifest_sha256"):
        if marker.get(k) != (s.get(k) if k in ("repo", "revision") else info.get(k)):
            return False, f"staged {k} {marker.get(k)!r} differs"
    for f in marker.get("files", []):
        fp = os.path.join(s["path"], f["path"])
        if not os.path.isfile(fp) or os.path.getsize(fp) != f["size"]:
            return False, f"{f['path']} is missing or changed since it was staged"
    return True, "already staged and verified"


def free_bytes(path):
    """Free bytes for an unprivileged writer on the filesystem that holds (or will hold) path."""
    p = path
    while not os.path.exists(p):
        p = os.path.dirname(p) or "/"
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


def preflight(sets, run, source, mirror, hub_endpoint, token, headroom_gb):
    """Decide what to stage, clean up after killed runs, and check the disk before any byte
    moves."""
    removed = []
    out = []
    for s in sets:
        for stale in glob.glob(glob.escape(s["path"]) + ".staging-*") + glob.glob(
            glob.escape(s["path"]) + ".old-*"
        ):
            if (
                stale != staging_dir(s["path"], run)
                and os.path.isdir(stale)
                and not os.path.islink(stale)
            ):
                shutil.rmtree(stale)
                removed.append(stale)
        info = source_info(s, source, mirror, hub_endpoint, token)
        current, reason = is_current(s, info)
        out.append(
            {
                "role": s["role"],
                "repo": s["repo"],
                "revision": s["revision"],
                "path": s["path"],
                "state": "current" if current else "stage",
                "reason": reason,
                "bytes": info["bytes"],
                "commit": info["commit"],
                "revision_date": info["revision_date"],
                "manifest_sha256": info["manifest_sha256"],
            }
        )
    need = sum(x["bytes"] for x in out if x["state"] == "stage")
    headroom = int(float(headroom_gb) * GB)
    free = free_bytes(sets[0]["path"]) if sets else 0
    report = {
        "sets": out,
        "need_bytes": need,
        "free_bytes": free,
        "headroom_bytes": headroom,
        "removed": removed,
        "rsync_root": rsync_root(sets),
        "rrsync": find_rrsync(),
    }
    if need and free < need + headroom:
        raise_msg = (
            f"not enough disk for the weights: {need / GB:.2f} GB to stage + {headroom / GB:.2f} "
            "GB headroom, "
            f"only {free / GB:.2f} GB free at {os.path.dirname(sets[0]['path'])}"
        )
        return report, raise_msg
    return report, None


def rsync_root(sets):
    """The directory the receivers may read on the seed: the narrowest one holding every set's
    staging dir."""
    if not sets:
        return None
    return os.path.commonpath([os.path.dirname(s["path"].rstrip("/")) for s in sets])


def find_rrsync():
    """rsync's restricted wrapper (rsync >= 3.2.4 installs /usr/bin/rrsync; older Debian ships it
    as a doc)."""
    for c in (shutil.which("rrsync"), "/usr/share/doc/rsync/scripts/rrsync"):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def _download(url, dest, size, sha256):
    """Stream one file to dest, hashing as it goes; a mismatch deletes it and fails."""
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    part = dest + ".part"
    h = hashlib.sha256()
    got = 0

    def sink(chunk):
        nonlocal got
        f.write(chunk)
        h.update(chunk)
        got += len(chunk)

    try:
        # Stop at the manifest's size: a mirror sending more (or forever) fills no disk.
        with _OPENER.open(url, timeout=HTTP_TIMEOUT) as r, open(part, "wb") as f:
            _read_capped(r, url, size, time.monotonic() + HTTP_TIMEOUT + size / MIN_RATE, sink)
    except StageError:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        raise StageError(f"download of {_safe(url)} failed ({getattr(e, 'reason', e)})") from None
    if got != size or (sha256 and h.hexdigest() != sha256):
        os.unlink(part)
        raise StageError(
            f"{_safe(url)}: got {got} bytes with sha256 {h.hexdigest()[:12]}…, the manifest says "
            f"{size} bytes, {str(sha256)[:12]}…"
        )
    os.replace(part, dest)
    return got


def fetch(s, run, source, mirror, hub_endpoint, token):
    """Download one set into its staging directory; return bytes and seconds."""
    info = source_info(s, source, mirror, hub_endpoint, token)
    dest = staging_dir(s["path"], run)
    os.makedirs(dest, exist_ok=True)
    t0 = time.monotonic()
    got = 0
    if source == "local":
        # The role has rsynced <local dir>/<repo>/<revision>/ here; its manifest.json (if any) says
        # the date.
        listed = os.path.join(dest, "manifest.json")
        if os.path.isfile(listed):
            manifest = read_json(listed) or {}
            os.replace(listed, os.path.join(dest, MANIFEST))
            info["revision_date"] = (
                manifest.get("revision_date") if isinstance(manifest, dict) else None
            )
        # lstat: a symlink may dangle here; verification says why that is refused.
        got = sum(os.lstat(os.path.join(d, f)).st_size for d, _, fs in os.walk(dest) for f in fs)
    elif source == "mirror":
        root = os.path.realpath(dest)
        for f in info["manifest"]["files"]:
            rel = str(f["path"])
            target = os.path.realpath(os.path.join(dest, rel))
            if os.path.commonpath([root, target]) != root:
                raise StageError(f"the manifest names {rel!r}, a path outside the directory")
            got += _download(
                f"{info['url']}/{urllib.parse.quote(rel)}", target, int(f["size"]), f.get("sha256")
            )
        with open(os.path.join(dest, MANIFEST), "w") as fh:
            json.dump(info["manifest"], fh)
    else:
        hf = shutil.which("hf") or shutil.which("huggingface-cli")
        if hf is None:
            raise StageError(
                "the hf command (huggingface_hub) is not installed on the host: "
                "fix: pip install -U 'huggingface_hub[cli]' or set weights_source: mirror"
            )
        env = dict(
            os.environ,
            HF_HUB_ENABLE_HF_TRANSFER=os.environ.get("HF_HUB_ENABLE_HF_TRANSFER", "0"),
            HF_ENDPOINT=hub_endpoint,
        )
        if token:
            env["HF_TOKEN"] = token
        argv = [hf, "download", s["repo"], "--revision", info["commit"], "--local-dir", dest]
        p = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if p.returncode != 0:
            tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
            if token:
                tail = tail.replace(token, "<token>")
            raise StageError(f"hf download {s['repo']} failed: {tail}")
        shutil.rmtree(os.path.join(dest, ".cache"), ignore_errors=True)  # hf's download metadata
        got = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(dest) for f in fs)
    with open(os.path.join(dest, SOURCE), "w") as fh:
        json.dump(
            {
                "repo": s["repo"],
                "revision": s["revision"],
                "commit": info["commit"],
                "source": source,
                "revision_date": info["revision_date"],
                "manifest_sha256": info["manifest_sha256"],
            },
            fh,
        )
    secs = time.monotonic() - t0
    return {"role": s["role"], "bytes": got, "seconds": round(secs, 3),
            "mb_per_s": round(got / 1e6 / secs, 2) if secs > 0 else None}


def _exchange(a, b):
    """Atomically swap two paths (Linux renameat2); False when the filesystem cannot."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return rc == 0


def swap(s, run):
    """Put a verified staging directory in place of the target; remove the old set."""
    dest = staging_dir(s["path"], run)
    if not os.path.isdir(dest):
        raise StageError(f"{dest} does not exist: nothing was staged for {s['role']} in this run")
    src = read_json(os.path.join(dest, SOURCE)) or {}
    files = []
    for d, _, fs in os.walk(dest):
        for f in fs:
            rel = os.path.relpath(os.path.join(d, f), dest)
            if rel not in (MARKER, SOURCE, MANIFEST) and not os.path.islink(os.path.join(d, f)):
                files.append({"path": rel, "size": os.path.getsize(os.path.join(d, f))})
    marker = {
        "repo": s["repo"],
        "revision": s["revision"],
        "commit": src.get("commit"),
        "manifest_sha256": src.get("manifest_sha256"),
        "revision_date": src.get("revision_date"),
        "run": run,
        "staged_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": sorted(files, key=lambda x: x["path"]),
        "bytes": sum(f["size"] for f in files),
    }
    tmp = os.path.join(dest, MARKER + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(marker, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, os.path.join(dest, MARKER))
    if os.path.lexists(s["path"]):
        if not _exchange(dest, s["path"]):
            # Fallback for filesystems without RENAME_EXCHANGE: two renames, old kept until the new
            # is in.
            old = f"{s['path']}.old-{run}"
            os.rename(s["path"], old)
            os.rename(dest, s["path"])
            dest = old
        shutil.rmtree(dest)  # now the previous set
    else:
        os.makedirs(os.path.dirname(s["path"]), exist_ok=True)
        os.rename(dest, s["path"])
    return {"role": s["role"], "path": s["path"], "bytes": marker["bytes"], "files": len(files)}


def receive(sets, run, seed, key, known_hosts, timeout):
    """Pull each set's staging directory from a source host (the seed or any host that verified it)
    with rsync.

    The key lives in a private directory on /run for the duration of this call only
    (removed in ``finally``, also when rsync fails); the seed's host key is checked
    against ``known_hosts`` (the controller's verified entries), never learnt.
    """
    keydir = os.path.join(KEY_BASE, f"fleetctl-stage-{run}")
    # A receive killed with its controller (SIGKILL) never reached its finally: its key is removed
    # here, by the next run (the seed's line for it is gone already: the next preflight removes it).
    for stale in glob.glob(os.path.join(KEY_BASE, "fleetctl-stage-*")):
        if stale != keydir and os.path.isdir(stale) and not os.path.islink(stale):
            shutil.rmtree(stale, ignore_errors=True)
    os.makedirs(keydir, mode=0o700, exist_ok=True)
    os.chmod(keydir, 0o700)
    got = []
    try:
        for name, text in (("id_ed25519", key), ("known_hosts", known_hosts)):
            fd = os.open(os.path.join(keydir, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(text.rstrip("\n") + "\n")
        ssh_cmd = (
            f"ssh -i {keydir}/id_ed25519 -p {int(seed['port'])} -o "
            f"UserKnownHostsFile={keydir}/known_hosts "
            "-o StrictHostKeyChecking=yes -o BatchMode=yes -o IdentitiesOnly=yes"
        )
        if seed.get("host_key_alias"):
            # Over the fabric: the source's host key is the one verified for its management address.
            ssh_cmd += f" -o HostKeyAlias={seed['host_key_alias']}"
        who = (
            f"{seed['host']} ({seed['address']}{', fabric' if seed.get('via') == 'fabric' else ''})"
            if seed.get("host")
            else f"the seed {seed['address']}"
        )
        for s in sets:
            dest = staging_dir(s["path"], run)
            os.makedirs(dest, exist_ok=True)
            t0 = time.monotonic()
            # -W: whole files (nothing to delta against in a fresh staging directory; saves CPU).
            # The seed forces `rrsync -ro ROOT` for this key: paths are relative to ROOT, and rrsync
            # refuses --protect-args (it checks the arguments itself; recipe paths are plain,
            # validated).
            remote = os.path.relpath(dest, seed["root"]) if seed.get("root") else dest
            argv = ["rsync", "-a", "-W", "--delete", "--partial", "-e", ssh_cmd,
                    f"{seed['user']}@{seed['address']}:{remote}/", f"{dest}/"]
            try:
                p = subprocess.run(
                    argv, capture_output=True, text=True, timeout=timeout, check=False
                )
            except subprocess.TimeoutExpired:
                raise StageError(f"rsync of {s['role']} from {who} took over {timeout}s") from None
            if p.returncode != 0:
                tail = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
                raise StageError(f"rsync of {s['role']} from {who} failed: {tail}")
            secs = time.monotonic() - t0
            nbytes = sum(
                os.lstat(os.path.join(d, f)).st_size for d, _, fs in os.walk(dest) for f in fs
            )
            got.append(
                {
                    "role": s["role"],
                    "bytes": nbytes,
                    "seconds": round(secs, 3),
                    "from": seed.get("host"),
                    "via": seed.get("via", "lan"),
                    "round": seed.get("round"),
                    "mb_per_s": round(nbytes / 1e6 / secs, 2) if secs > 0 else None,
                }
            )
    finally:
        shutil.rmtree(keydir, ignore_errors=True)
    return got


def main():
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "step": {
                "type": "str",
                "required": True,
                "choices": ["preflight", "fetch", "receive", "swap"],
            },
            "seed": {"type": "dict"},
            "key": {"type": "str", "no_log": True},
            "known_hosts": {"type": "str"},
            "timeout": {"type": "int", "default": 3600},
            "sets": {"type": "list", "elements": "dict", "required": True},
            "run": {"type": "str", "required": True},
            "source": {"type": "str", "default": "mirror", "choices": ["mirror", "hub", "local"]},
            "mirror": {"type": "str"},
            "hub_endpoint": {"type": "str", "default": "https://huggingface.co"},
            "token": {"type": "str", "no_log": True},
            "headroom_gb": {"type": "float", "default": 5.0},
            "only": {"type": "list", "elements": "str"},
        },
        supports_check_mode=False,
    )
    p = module.params
    sets = [s for s in p["sets"] if p["only"] is None or s["role"] in p["only"]]
    try:
        if p["step"] == "preflight":
            report, problem = preflight(
                sets,
                p["run"],
                p["source"],
                p["mirror"],
                p["hub_endpoint"],
                p["token"],
                p["headroom_gb"],
            )
            res = {"changed": bool(report["removed"]), "fleetctl_report": {"preflight": report},
                   "stage_roles": [x["role"] for x in report["sets"] if x["state"] == "stage"]}
            if problem:
                module.fail_json(
                    msg=problem + " (fix: free space under /opt, or stage to a larger disk)", **res
                )
            module.exit_json(**res)
        elif p["step"] == "fetch":
            got = [
                fetch(s, p["run"], p["source"], p["mirror"], p["hub_endpoint"], p["token"])
                for s in sets
            ]
            module.exit_json(changed=bool(got), fleetctl_report={"fetch": got})
        elif p["step"] == "receive":
            got = receive(sets, p["run"], p["seed"], p["key"], p["known_hosts"], p["timeout"])
            module.exit_json(changed=bool(got), fleetctl_report={"receive": got})
        else:
            done = [swap(s, p["run"]) for s in sets]
            module.exit_json(changed=bool(done), fleetctl_report={"swap": done})
    except StageError as e:
        module.fail_json(msg=str(e))
    except OSError as e:
        module.fail_json(msg=f"{p['step']} failed: {e}")


if __name__ == "__main__":
    main()
