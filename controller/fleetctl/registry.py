"""A small client of the OCI distribution API: list tags, resolve a version to a tag, find its digest.

Works against ghcr.io (bearer tokens from the ``WWW-Authenticate`` challenge,
anonymous or with credentials from the environment), Docker Hub and plain
``registry:2`` mirrors over http (the lab's, or a site's pull-through cache),
chosen through ``fleetctl_registry_mirrors``. Standard library only: the
protocol is a handful of GETs and the controller should not need more.

Credentials come from ``$FLEETCTL_REGISTRY_USER`` / ``$FLEETCTL_REGISTRY_PASSWORD``
(for ghcr.io: a GitHub user and a token with ``read:packages``); they are sent
only to the token realm or a Basic challenge and never appear in errors.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


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
        """``ghcr.io/aeon-7/x`` -> (ghcr.io, aeon-7/x); ``vllm/vllm-openai`` -> (docker.io, vllm/vllm-openai)."""
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
    mirror = (mirrors or {}).get(registry)
    if mirror:
        m = str(mirror).rstrip("/")
        if m.startswith(("http://", "https://")):
            scheme, _, host = m.partition("://")
            return Endpoint(scheme, host)
        return Endpoint("http", m)
    host = _DOCKER_HUB_API if registry == DOCKER_HUB else registry
    return Endpoint("https", host)


def pull_ref(image: str, digest: str, mirrors: Mapping[str, str] | None = None) -> str:
    """The reference a host pulls: ``<mirror or registry>/<repository>@<digest>``."""
    name = ImageName.parse(image)
    mirror = (mirrors or {}).get(name.registry)
    if mirror:
        host = str(mirror).split("://", 1)[-1].rstrip("/")
        return f"{host}/{name.repository}@{digest}"
    return f"{name.ref}@{digest}"


def resolve_tag(wanted: str, tags: list[str], image: str = "") -> str:
    """The one tag ``wanted`` names: itself if it exists, else the one tag it is the version suffix of.

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
    near = sorted(tags, reverse=True)[:12]
    raise FleetError(
        f"no tag {wanted!r}{where}",
        fix=f"use one of: {', '.join(near) or '(the repository has no tags)'}"
        + (" ..." if len(tags) > len(near) else ""),
    )


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

    def __init__(self, registry: str, mirrors: Mapping[str, str] | None = None, timeout: float = 15.0,
                 env: Mapping[str, str] | None = None) -> None:
        self.registry = registry
        self.endpoint = endpoint(registry, mirrors)
        self.timeout = timeout
        e = os.environ if env is None else env
        self._user = e.get("FLEETCTL_REGISTRY_USER")
        self._password = e.get("FLEETCTL_REGISTRY_PASSWORD")
        self._tokens: dict[str, str] = {}

    def tags(self, repository: str) -> list[str]:
        """Every tag of ``repository``, following the ``Link: rel=next`` pagination."""
        url: str | None = f"{self.endpoint.base}/v2/{repository}/tags/list?n={_PAGE}"
        out: list[str] = []
        for _ in range(_MAX_PAGES):
            if url is None:
                return out
            status, headers, body = self._request("GET", url, repository)
            if status == 404:
                raise FleetError(f"repository {repository} does not exist on {self.endpoint.host}",
                                 fix="check the recipe's image and fleetctl_registry_mirrors")
            data = _json(body, url)
            out.extend(str(t) for t in data.get("tags") or [])
            url = _next_link(headers.get("link"), url)
        raise FleetError(f"{self.endpoint.host} returned more than {_MAX_PAGES} pages of tags for {repository}",
                         fix="report this registry's pagination behaviour")

    def digest(self, repository: str, tag: str) -> tuple[str, str]:
        """``(digest, media type)`` of ``repository:tag``'s manifest (HEAD, GET if HEAD lacks it)."""
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
            digest = h.get("docker-content-digest") or "sha256:" + hashlib.sha256(body).hexdigest()
            media = h.get("content-type", "").split(";")[0]
        if media and media not in MANIFEST_TYPES:
            raise FleetError(f"{repository}:{tag} has manifest type {media!r}, not an image",
                             fix="point the recipe at an image repository")
        return digest, media

    def resolve(self, image: str, wanted: str) -> ResolvedImage:
        """Tag list -> the one tag ``wanted`` names -> its digest."""
        name = ImageName.parse(image)
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
            if token:
                hdrs["Authorization"] = token
            status, h, body = self._raw(method, url, hdrs)
            if status != 401 or attempt == 1:
                break
            self._tokens[scope] = self._authorise(h.get("www-authenticate", ""), scope)
        if status == 401:
            raise FleetError(
                f"{self.endpoint.host} refused access to {repository} (HTTP 401)",
                fix="set FLEETCTL_REGISTRY_USER and FLEETCTL_REGISTRY_PASSWORD (for ghcr.io: a token with read:packages)",
            )
        if status >= 400 and status != 404:
            raise FleetError(f"{self.endpoint.host}: {method} {urllib.parse.urlsplit(url).path} returned HTTP {status}",
                             fix="check the registry's health and the image name")
        return status, h, body

    def _authorise(self, challenge: str, scope: str) -> str:
        """The Authorization header answering a 401's challenge (Bearer via the realm, or Basic)."""
        kind, _, params_text = challenge.partition(" ")
        params = dict(_CHALLENGE_PARAM.findall(params_text))
        if kind.lower() == "basic":
            if not (self._user and self._password):
                raise FleetError(f"{self.endpoint.host} wants a user and password",
                                 fix="set FLEETCTL_REGISTRY_USER and FLEETCTL_REGISTRY_PASSWORD")
            return "Basic " + base64.b64encode(f"{self._user}:{self._password}".encode()).decode()
        if kind.lower() != "bearer" or "realm" not in params:
            raise FleetError(f"{self.endpoint.host} sent an authentication challenge fleetctl cannot answer: {kind!r}",
                             fix="use a registry with bearer-token or basic auth, or a mirror")
        query = {"scope": params.get("scope", scope)}
        if "service" in params:
            query["service"] = params["service"]
        url = params["realm"] + ("&" if "?" in params["realm"] else "?") + urllib.parse.urlencode(query)
        hdrs: dict[str, str] = {}
        if self._user and self._password:
            hdrs["Authorization"] = "Basic " + base64.b64encode(f"{self._user}:{self._password}".encode()).decode()
        status, _, body = self._raw("GET", url, hdrs)
        if status != 200:
            raise FleetError(f"token service {urllib.parse.urlsplit(url).netloc} answered HTTP {status} for {query['scope']}",
                             fix="check FLEETCTL_REGISTRY_USER/FLEETCTL_REGISTRY_PASSWORD, or that the image is public")
        data = _json(body, urllib.parse.urlsplit(url).netloc)
        token = data.get("token") or data.get("access_token")
        if not isinstance(token, str) or not token:
            raise FleetError("the registry's token service returned no token", fix="check the registry")
        return f"Bearer {token}"

    def _raw(self, method: str, url: str, headers: Mapping[str, str]) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(url, method=method, headers=dict(headers))
        opener = urllib.request.build_opener(_NoRedirectAuth())
        try:
            with opener.open(req, timeout=self.timeout) as resp:
                return resp.status, _lower(resp.headers.items()), resp.read()
        except urllib.error.HTTPError as e:
            return e.code, _lower(e.headers.items()), e.read()
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise FleetError(f"cannot reach registry {self.endpoint.base}: {reason}",
                             fix="check the network, or fleetctl_registry_mirrors in the inventory") from None


class _NoRedirectAuth(urllib.request.HTTPRedirectHandler):
    """Follow redirects (blob stores, token realms) but never carry the Authorization header along."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


def _lower(items: Any) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in items}


def _json(body: bytes, where: str) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        raise FleetError(f"{where} answered with something that is not JSON", fix="check the registry URL") from None
    if not isinstance(data, dict):
        raise FleetError(f"{where} answered with unexpected JSON", fix="check the registry URL")
    return data


def _next_link(link: str | None, current: str) -> str | None:
    if not link:
        return None
    m = _LINK_NEXT.search(link)
    return urllib.parse.urljoin(current, m.group(1)) if m else None


def resolve(image: str, wanted: str, mirrors: Mapping[str, str] | None = None,
            timeout: float = 15.0) -> ResolvedImage:
    """Resolve ``wanted`` (a version or a full tag) of ``image`` to its tag and digest."""
    return Registry(ImageName.parse(image).registry, mirrors, timeout).resolve(image, wanted)
