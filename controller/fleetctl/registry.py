"""A small client of the OCI distribution API: list tags, resolve a version to a tag, find its
digest.

Works against ghcr.io (bearer tokens from the ``WWW-Authenticate`` challenge,
anonymous or with credentials from the environment), Docker Hub and plain
``registry:2`` mirrors over http (the lab's, or a site's pull-through cache),
chosen through ``fleetctl_registry_mirrors``. Standard library only: the
protocol is a handful of GETs and the controller should not need more.

Credentials come from ``$FLEETCTL_REGISTRY_USER`` / ``$FLEETCTL_REGISTRY_PASSWORD``
(for ghcr.io: a GitHub user and a token with ``read:packages``) and never appear
in errors. They are sent only over https, and only to the registry's own host and port
(ghcr.io's realm is ghcr.io/token), Docker Hub's token service for Docker Hub,
or a ``host[:port]`` the inventory lists in ``fleetctl_registry_auth_hosts``: a registry (or
a man in the middle of a plain-http mirror) naming another ``realm`` gets an
anonymous token request, never the password. Bearer tokens are not carried
across hosts or from https to http on redirects.

Every answer is read with a size cap (:data:`MAX_BODY`) and an overall
deadline per request (:data:`REQUEST_DEADLINE`) on the whole exchange, headers too
(:mod:`fleetctl.httpbound`), not only the socket's idle timeout: a registry that drips
bytes cannot hold a rollout. A cached token goes only to the registry's own origin, and a
tag list's next page must stay there.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import http.client
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from fleetctl import httpbound
from fleetctl.errors import FleetError

#: Manifest media types we accept, most general first: a multi-arch index's digest is what
#: ``docker pull IMAGE@DIGEST`` wants on every host (each picks its own platform from it).
MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
)
DOCKER_HUB = "docker.io"
_DOCKER_HUB_API = "registry-1.docker.io"
_PAGE = 200
_MAX_PAGES = 100
_LINK_NEXT = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}\Z")
#: The OCI distribution spec's tag grammar.
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}\Z")


def check_tag(wanted: str, what: str = "tag") -> str:
    """``wanted`` if it is a tag by the OCI grammar (a version like v0.24.0 is one); else one clear
    refusal.

    Tags reach shell lines, container labels and URLs: anything else is refused
    before it is used anywhere.
    """
    if not _TAG.match(wanted):
        raise FleetError(
            f"{what} {wanted!r} is not an image tag (letters, digits, '_', '.' and '-', at most "
            "128, "
            "not starting with '.' or '-')",
            fix="pass a version like v0.24.0 or a full tag",
        )
    return wanted


def check_digest(digest: str, where: str = "") -> str:
    """``digest`` if it is ``sha256:`` and 64 lowercase hex digits; else a refusal naming ``where``
    it came from."""
    if not _DIGEST.match(digest):
        raise FleetError(f"{where or 'the'} digest {digest[:80]!r} is not sha256:<64 hex digits>",
                         fix="check the registry (or the ledger record) it came from")
    return digest
#: Largest answer read from a registry (a tag page, a manifest, a token): real ones are < 100 KB.
MAX_BODY = 4 * 1024 * 1024
#: Seconds one request may take in all (connect, headers, body), however slowly the bytes come.
REQUEST_DEADLINE = 60.0
#: Largest tag list read across all its pages (bytes of the pages together, and tags): a real
#: repository's is well under 1 MiB (vllm/vllm-openai: a few thousand tags).
MAX_TAG_BYTES = 8 * 1024 * 1024
MAX_TAGS = 100_000
#: Tags an unknown tag's "closest" suggestion compares against at most (difflib's work is per tag).
MAX_SUGGEST = 2_000
#: Token services of registries whose realm is not on the registry's own host.
_KNOWN_AUTH_HOSTS: Mapping[str, frozenset[str]] = {_DOCKER_HUB_API: frozenset({"auth.docker.io"})}


@dataclass(frozen=True)
class ImageName:
    """An image repository split into its registry host and path (no tag, no digest)."""

    registry: str
    repository: str

    @property
    def ref(self) -> str:
        """The canonical ``registry/repository`` (``docker.io`` images keep their short name)."""
        if self.registry == DOCKER_HUB:
            return self.repository.removeprefix("library/")
        return f"{self.registry}/{self.repository}"

    @classmethod
    def parse(cls, image: str) -> ImageName:
        """``ghcr.io/aeon-7/x`` -> (ghcr.io, aeon-7/x); ``vllm/vllm-openai`` -> (docker.io,
        vllm/vllm-openai)."""
        name = image.split("@", 1)[0]
        last = name.rsplit("/", 1)[-1]
        if ":" in last:  # a tag on the last component, not a registry port
            name = name[: len(name) - len(last)] + last.split(":", 1)[0]
        first, _, rest = name.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            return cls(first, rest)
        repo = name if "/" in name else f"library/{name}"
        return cls(DOCKER_HUB, repo)


@dataclass(frozen=True)
class Endpoint:
    """Where the API of a registry is reached: ``scheme://host`` (a mirror may be plain http)."""

    scheme: str
    host: str

    @property
    def base(self) -> str:
        """``scheme://host``."""
        return f"{self.scheme}://{self.host}"


def endpoint(registry: str, mirrors: Mapping[str, str] | None = None) -> Endpoint:
    """The API endpoint for ``registry``, through its mirror when one is configured.

    A mirror written ``host:port`` is an insecure (plain http) registry, as the
    Docker daemon's ``insecure-registries`` entries are; write ``https://host``
    for a TLS mirror.
    """
    mirror = check_mirror(registry, (mirrors or {}).get(registry))
    if mirror:
        m = str(mirror).rstrip("/")
        if m.startswith(("http://", "https://")):
            scheme, _, host = m.partition("://")
            return Endpoint(scheme, host)
        return Endpoint("http", m)
    host = _DOCKER_HUB_API if registry == DOCKER_HUB else registry
    return Endpoint("https", host)


def check_mirror(registry: str, mirror: object) -> str | None:
    """``mirror`` (of ``fleetctl_registry_mirrors``) as a string when it carries no ``user:pass@``;
    else a refusal that does not show the password (it would reach progress, the plan, ``--json``
    and every host's pull reference). None for no mirror."""
    if not mirror:
        return None
    m = str(mirror)
    netloc = m.split("://", 1)[-1].split("/", 1)[0]
    if "@" in netloc:
        shown = m.replace(netloc, "<redacted>@" + netloc.rsplit("@", 1)[1], 1)
        raise FleetError(
            f"fleetctl_registry_mirrors names {shown} for {registry}: a mirror with a user name or "
            "password would show it in progress, the plan, --json and each host's pull reference",
            fix="write the mirror as host:port or https://host, and give the credentials in "
                "FLEETCTL_REGISTRY_USER and FLEETCTL_REGISTRY_PASSWORD (sent over https only)")
    return m


def pull_ref(image: str, digest: str, mirrors: Mapping[str, str] | None = None) -> str:
    """The reference a host pulls: ``<mirror or registry>/<repository>@<digest>``."""
    name = ImageName.parse(image)
    mirror = check_mirror(name.registry, (mirrors or {}).get(name.registry))
    if mirror:
        host = str(mirror).split("://", 1)[-1].rstrip("/")
        return f"{host}/{name.repository}@{digest}"
    return f"{name.ref}@{digest}"


def resolve_tag(wanted: str, tags: list[str], image: str = "") -> str:
    """The one tag ``wanted`` names: itself if it exists, else the one tag it is the version suffix
    of.

    ``v0.24.0`` -> ``2026-07-01-v0.24.0`` (tags end with ``-<version>``); failing
    a suffix, a tag holding it as a whole dash-separated part
    (``v0.23.0`` -> ``2026-06-18-v0.23.0-dflashfix``). Several candidates, or
    none, is an error listing what exists: a rollout must never guess.
    """
    if wanted in tags:
        return wanted
    suffix = [t for t in tags if t.endswith(f"-{wanted}")]
    candidates = suffix or [t for t in tags if f"-{wanted}-" in f"-{t}-"]
    where = f" in {image}" if image else ""
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise FleetError(
            f"tag {wanted!r} is ambiguous{where}: it matches {', '.join(sorted(candidates))}",
            fix="pass the full tag",
        )
    raise FleetError(f"no tag {wanted!r}{where}", fix=_unknown_tag_fix(wanted, tags))


_VERSION = re.compile(r"^v?(\d+(?:\.\d+)+)$")


def versions(tags: list[str]) -> list[tuple[str, str]]:
    """(version, the tag it names) for every version ``resolve_tag`` understands, newest first.

    A version is a dash-separated part like ``v0.24.0``; a registry also holds test builds,
    nightlies and other tags, which are left out (a real one holds hundreds).
    """
    found: dict[str, str] = {}
    for t in sorted(tags):
        for part in t.split("-"):
            # Several tags of one version: the one it resolves to (ending in it) is shown.
            if _VERSION.match(part) and (
                part not in found
                or (t.endswith(f"-{part}") and not found[part].endswith(f"-{part}"))
            ):
                found[part] = t
    def key(item: tuple[str, str]) -> tuple[int, ...]:
        m = _VERSION.match(item[0])
        return tuple(int(x) for x in m.group(1).split(".")) if m else ()

    return sorted(found.items(), key=key, reverse=True)


def _unknown_tag_fix(wanted: str, tags: list[str]) -> str:
    """What to type instead: the versions the registry holds (newest first) and the tags closest to
    ``wanted``."""
    if not tags:
        return "the repository has no tags: push the image first"
    vs = versions(tags)
    shown = ", ".join(f"{v} ({t})" if v != t else v for v, t in vs[:8]) + (
        " ..." if len(vs) > 8 else ""
    )
    pool = ([v for v, _ in vs] + list(tags))[:MAX_SUGGEST]
    close = difflib.get_close_matches(wanted, pool, n=3, cutoff=0.6)
    parts = [
        f"versions, newest first: {shown}"
        if vs
        else f"no tag here names a version; {len(tags)} other tag(s)"
    ]
    if close:
        parts.append(f"closest to {wanted!r}: {', '.join(close)}")
    return "; ".join(parts)


@dataclass(frozen=True)
class ResolvedImage:
    """A tag pinned to the bytes it names: what a rollout deploys on every host."""

    image: str
    requested: str
    tag: str
    digest: str
    media_type: str


class Registry:
    """One registry's API, with a bearer token cached per scope for the client's life."""

    def __init__(
        self,
        registry: str,
        mirrors: Mapping[str, str] | None = None,
        timeout: float = 15.0,
        env: Mapping[str, str] | None = None,
        auth_hosts: Collection[str] = (),
        deadline: float = REQUEST_DEADLINE,
    ) -> None:
        self.registry = registry
        self.endpoint = endpoint(registry, mirrors)
        self.timeout = timeout
        self.deadline = deadline
        self.origin = _origin(self.endpoint.base)
        known = _KNOWN_AUTH_HOSTS.get(self.origin[1], ())
        # (host, port) pairs the password may go to over https: a name alone would let a token
        # server on another port of the registry's host collect it.
        self.auth_hosts = frozenset({self.origin[1:], *(_origin(f"https://{h}")[1:]
                                                        for h in (*auth_hosts, *known))})
        e = os.environ if env is None else env
        self._user = e.get("FLEETCTL_REGISTRY_USER")
        self._password = e.get("FLEETCTL_REGISTRY_PASSWORD")
        self._tokens: dict[str, str] = {}

    def tags(self, repository: str) -> list[str]:
        """Every tag of ``repository``, following the ``Link: rel=next`` pagination."""
        url: str | None = f"{self.endpoint.base}/v2/{repository}/tags/list?n={_PAGE}"
        out: list[str] = []
        read = 0
        for _ in range(_MAX_PAGES):
            if url is None:
                return out
            status, headers, body = self._request("GET", url, repository)
            if status == 404:
                raise FleetError(f"repository {repository} does not exist on {self.endpoint.host}",
                                 fix="check the recipe's image and fleetctl_registry_mirrors")
            read += len(body)
            data = _json(body, url)
            # A tag outside the OCI grammar is the registry's error: never a candidate for a
            # rollout.
            out.extend(
                str(t) for t in data.get("tags") or [] if isinstance(t, str) and _TAG.match(t)
            )
            if read > MAX_TAG_BYTES or len(out) > MAX_TAGS:
                raise FleetError(
                    f"{self.endpoint.host} listed more than {MAX_TAGS:,} tags or "
                    f"{MAX_TAG_BYTES >> 20} MiB of tag pages for {repository}",
                    fix="check the registry URL (or its mirror): a repository holds a few "
                        "thousand tags; pass a full tag to skip nothing else")
            url = self._next_link(headers.get("link"), url, repository)
        raise FleetError(
            f"{self.endpoint.host} returned more than {_MAX_PAGES} pages of tags for {repository}",
            fix="report this registry's pagination behaviour",
        )

    def digest(self, repository: str, tag: str) -> tuple[str, str]:
        """``(digest, media type)`` of ``repository:tag``'s manifest (HEAD, GET if HEAD lacks
        it)."""
        url = f"{self.endpoint.base}/v2/{repository}/manifests/{urllib.parse.quote(tag, safe='')}"
        headers = {"Accept": ", ".join(MANIFEST_TYPES)}
        status, h, _ = self._request("HEAD", url, repository, headers)
        if status == 404:
            raise FleetError(f"no manifest for {repository}:{tag} on {self.endpoint.host}",
                             fix="the tag was listed but has no manifest: push it again")
        digest = h.get("docker-content-digest", "")
        media = h.get("content-type", "").split(";")[0]
        if not _DIGEST.match(digest):
            # Some registries omit the header on HEAD; the digest is then the hash of the body.
            status, h, body = self._request("GET", url, repository, headers)
            digest = "sha256:" + hashlib.sha256(body).hexdigest()
            given = h.get("docker-content-digest")
            if given and given != digest:
                raise FleetError(
                    f"{self.endpoint.host}'s {repository}:{tag}: Docker-Content-Digest "
                    f"{given[:80]!r} is not the sha256 of the manifest it sent ({digest})",
                    fix="check the registry (or its mirror): it names other bytes than it serves")
            media = h.get("content-type", "").split(";")[0]
        if media and media not in MANIFEST_TYPES:
            raise FleetError(f"{repository}:{tag} has manifest type {media!r}, not an image",
                             fix="point the recipe at an image repository")
        return digest, media

    def layer_sizes(self, repository: str, digest: str) -> list[dict[str, int]]:
        """The size (bytes as pulled, compressed) of each layer of ``repository@digest``, by layer
        digest: one mapping per platform, since an index lists several and a host pulls the one of
        its own (attestation
        entries, platform ``unknown``, are left out; at most :data:`MAX_PLATFORMS`)."""
        check_digest(digest)
        data = self._manifest(repository, digest)
        if not isinstance(data.get("manifests"), list):
            return [_layers(data)]
        out = []
        for m in data["manifests"][:MAX_PLATFORMS]:
            plat = m.get("platform") if isinstance(m, dict) else None
            sub = m.get("digest") if isinstance(m, dict) else None
            if (
                not isinstance(sub, str)
                or not _DIGEST.match(sub)
                or (isinstance(plat, dict) and plat.get("os") == "unknown")
            ):
                continue
            out.append(_layers(self._manifest(repository, sub)))
        return out

    def _manifest(self, repository: str, digest: str) -> dict[str, Any]:
        url = f"{self.endpoint.base}/v2/{repository}/manifests/{digest}"
        status, _, body = self._request(
            "GET", url, repository, {"Accept": ", ".join(MANIFEST_TYPES)}
        )
        if status == 404:
            raise FleetError(f"no manifest {digest[:19]} in {repository} on {self.endpoint.host}",
                             fix="push the image again")
        return _json(body, url)

    def resolve(self, image: str, wanted: str) -> ResolvedImage:
        """Tag list -> the one tag ``wanted`` names -> its digest."""
        name = ImageName.parse(image)
        check_tag(wanted)
        tag = resolve_tag(wanted, self.tags(name.repository), name.ref)
        digest, media = self.digest(name.repository, tag)
        return ResolvedImage(name.ref, wanted, tag, digest, media)

    # -- HTTP and auth -------------------------------------------------------------------

    def _request(self, method: str, url: str, repository: str,
                 headers: Mapping[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        scope = f"repository:{repository}:pull"
        hdrs = dict(headers or {})
        for attempt in range(2):
            token = self._tokens.get(scope)
            if token and _origin(url) == self.origin:
                hdrs["Authorization"] = token
            status, h, body = self._raw(method, url, hdrs)
            if status != 401 or attempt == 1:
                break
            self._tokens[scope] = self._authorise(h.get("www-authenticate", ""), scope)
        if status == 401:
            raise FleetError(
                f"{self.endpoint.host} refused access to {repository} (HTTP 401)",
                fix="set FLEETCTL_REGISTRY_USER and FLEETCTL_REGISTRY_PASSWORD (for ghcr.io: a "
                    "token with read:packages)",
            )
        if status >= 400 and status != 404:
            raise FleetError(
                f"{self.endpoint.host}: {method} {urllib.parse.urlsplit(url).path} returned HTTP "
                f"{status}",
                fix="check the registry's health and the image name",
            )
        return status, h, body

    def _authorise(self, challenge: str, scope: str) -> str:
        """The Authorization header answering a 401's challenge (Bearer via the realm, or Basic)."""
        kind, _, params_text = challenge.partition(" ")
        params = dict(_CHALLENGE_PARAM.findall(params_text))
        if kind.lower() == "basic":
            if not (self._user and self._password):
                raise FleetError(f"{self.endpoint.host} wants a user and password",
                                 fix="set FLEETCTL_REGISTRY_USER and FLEETCTL_REGISTRY_PASSWORD")
            why = self._why_not_credentials(self.endpoint.base)
            if why:
                raise FleetError(f"{self.endpoint.host} wants a user and password, which {why}",
                                 fix="reach the registry over https (write the mirror as https://host)")
            return "Basic " + base64.b64encode(f"{self._user}:{self._password}".encode()).decode()
        if kind.lower() != "bearer" or "realm" not in params:
            raise FleetError(
                f"{self.endpoint.host} sent an authentication challenge fleetctl cannot answer: "
                f"{kind!r}",
                fix="use a registry with bearer-token or basic auth, or a mirror",
            )
        query = {"scope": params.get("scope", scope)}
        if "service" in params:
            query["service"] = params["service"]
        realm_scheme = urllib.parse.urlsplit(params["realm"]).scheme.lower()
        if realm_scheme not in ("https", self.endpoint.scheme):
            allowed = "https" if self.endpoint.scheme == "https" else "http or https"
            raise FleetError(
                f"{self.endpoint.host} named a token realm {params['realm'][:80]!r}: a realm of "
                f"this registry must be {allowed}",
                fix="check the registry (or a man in the middle of its mirror): a token service "
                    "is an https URL")
        url = (
            params["realm"]
            + ("&" if "?" in params["realm"] else "?")
            + urllib.parse.urlencode(query)
        )
        hdrs: dict[str, str] = {}
        why = self._why_not_credentials(url) if self._user and self._password else None
        if self._user and self._password and not why:
            hdrs["Authorization"] = (
                "Basic " + base64.b64encode(f"{self._user}:{self._password}".encode()).decode()
            )
        status, _, body = self._raw("GET", url, hdrs)
        if status != 200:
            realm = urllib.parse.urlsplit(url)
            if why:
                raise FleetError(
                    f"token service {realm.scheme}://{realm.netloc} answered HTTP {status} to an "
                    "anonymous request; "
                    f"the registry credentials were not sent because {why}",
                    fix=f"if {realm.hostname} is this registry's own token service, add it to "
                    "fleetctl_registry_auth_hosts in the inventory (it must be https)",
                )
            raise FleetError(
                f"token service {realm.netloc} answered HTTP {status} for {query['scope']}",
                fix="check FLEETCTL_REGISTRY_USER/FLEETCTL_REGISTRY_PASSWORD, or that the image is "
                    "public",
            )
        data = _json(body, f"token service {urllib.parse.urlsplit(url).netloc}")
        token = data.get("token") or data.get("access_token")
        if not isinstance(token, str) or not token:
            raise FleetError(
                "the registry's token service returned no token", fix="check the registry"
            )
        return f"Bearer {token}"

    def _why_not_credentials(self, url: str) -> str | None:
        """None when the password may go to ``url``; else why not (plain http, another host)."""
        u = urllib.parse.urlsplit(url)
        if u.scheme != "https":
            return f"{u.scheme}://{u.netloc} is not https"
        if _origin(url)[1:] not in self.auth_hosts:
            return (f"{u.netloc} is not the registry's host and port (nor in "
                    "fleetctl_registry_auth_hosts)")
        return None

    def _next_link(self, link: str | None, current: str, repository: str) -> str | None:
        """The next tag page of a ``Link: rel=next``, which must stay on the registry's own
        scheme, host and port: a page elsewhere would get this registry's Authorization."""
        if not link:
            return None
        m = _LINK_NEXT.search(link)
        if not m:
            return None
        nxt = str(urllib.parse.urljoin(current, m.group(1)))
        if _origin(nxt) != self.origin:
            u = urllib.parse.urlsplit(nxt)
            raise FleetError(
                f"{self.endpoint.host}'s tag list of {repository} points its next page to "
                f"{u.scheme}://{u.netloc}, another origin than {self.endpoint.base}",
                fix="check the registry (or a man in the middle of its mirror): pages of a tag "
                    "list stay on the registry")
        return nxt

    def _raw(
        self, method: str, url: str, headers: Mapping[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        """One request and its whole answer, by :data:`REQUEST_DEADLINE` however slowly its
        status line, headers or body come (a watchdog shuts the socket) and at most
        :data:`MAX_BODY`."""
        req = urllib.request.Request(url, method=method, headers=dict(headers))
        where = f"{self.endpoint.host}: {urllib.parse.urlsplit(url).path}"
        try:
            a = httpbound.exchange(req, timeout=self.timeout, deadline=self.deadline,
                                   max_bytes=MAX_BODY, handlers=(_NoRedirectAuth(),))
        except httpbound.Expired:
            raise FleetError(f"{where} did not finish its answer within {self.deadline:.0f}s",
                             fix="check the registry's health (or its mirror's)") from None
        except httpbound.TooLarge:
            raise FleetError(f"{where} answered with more than {MAX_BODY // (1024 * 1024)} MiB",
                             fix="check the registry URL: tag lists and manifests are small"
                             ) from None
        except (
            urllib.error.URLError,
            TimeoutError,
            OSError,
            http.client.HTTPException,
            ValueError,
        ) as e:
            reason = getattr(e, "reason", e)
            raise FleetError(
                f"cannot reach registry {self.endpoint.base}: {reason}",
                fix="check the network, or fleetctl_registry_mirrors in the inventory",
            ) from None
        return a.status, a.headers, a.body


class _NoRedirectAuth(urllib.request.HTTPRedirectHandler):
    """Follow redirects (blob stores, token realms) but never carry the Authorization header
    along."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        old_u, new_u = urllib.parse.urlsplit(req.full_url), urllib.parse.urlsplit(newurl)
        if new is not None and (new_u.netloc != old_u.netloc or new_u.scheme != old_u.scheme):
            new.remove_header("Authorization")
        return new


def _origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of ``url``, the port its scheme's default when not written."""
    u = urllib.parse.urlsplit(url)
    scheme = u.scheme.lower()
    try:
        port = u.port
    except ValueError:
        port = -1
    return scheme, (u.hostname or "").lower(), port or (443 if scheme == "https" else 80)


def _json(body: bytes, where: str) -> dict[str, Any]:
    data = httpbound.loads(body, where, "check the registry URL")
    if not isinstance(data, dict):
        raise FleetError(f"{where} answered with unexpected JSON", fix="check the registry URL")
    return data


#: Platforms of an index whose layers are read at most (a CUDA image has one or two).
MAX_PLATFORMS = 8


def _layers(manifest: Mapping[str, Any]) -> dict[str, int]:
    """Layer digest -> size of one image manifest."""
    out: dict[str, int] = {}
    for layer in manifest.get("layers") or []:
        if (
            isinstance(layer, dict)
            and isinstance(layer.get("digest"), str)
            and isinstance(layer.get("size"), int)
        ):
            out[layer["digest"]] = max(0, int(layer["size"]))
    return out


def layer_sizes(
    image: str,
    digest: str,
    mirrors: Mapping[str, str] | None = None,
    timeout: float = 15.0,
    auth_hosts: Collection[str] = (),
) -> list[dict[str, int]]:
    """:meth:`Registry.layer_sizes` of ``image@digest`` (through the mirrors, as the hosts pull
    it)."""
    name = ImageName.parse(image)
    return Registry(name.registry, mirrors, timeout, auth_hosts=auth_hosts).layer_sizes(
        name.repository, digest
    )


def resolve(image: str, wanted: str, mirrors: Mapping[str, str] | None = None,
            timeout: float = 15.0, auth_hosts: Collection[str] = ()) -> ResolvedImage:
    """Resolve ``wanted`` (a version or a full tag) of ``image`` to its tag and digest."""
    return Registry(
        ImageName.parse(image).registry, mirrors, timeout, auth_hosts=auth_hosts
    ).resolve(image, wanted)
