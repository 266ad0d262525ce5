"""Secrets never echoed: what a server sends is scrubbed of credentials before the soak keeps it.

A hostile or merely careless server can echo the ``Authorization`` header in a 401 body or an
SSE error event, or print the key in its log. Every string that came from a server (error
bodies, stream events, probe bodies, generated text, container log lines) passes through a
:class:`Scrubber` before it reaches progress, samples, scrapes, verdicts or reports; the
verdict and every progress event are scrubbed once more as a whole (a backstop).

The scrubber replaces the exact values it knows (the target's API key, ``$VLLM_API_KEY``,
``$HF_TOKEN``, a URL's password) and the shapes of credentials it does not (``Bearer ...``,
Hugging Face ``hf_...`` tokens, ``user:password@`` in URLs). An endpoint URL carrying
``user:password@`` is refused outright (:func:`validate_endpoint`), as webhook URLs are.
"""

from __future__ import annotations

import dataclasses
import os
import re
import urllib.parse
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

from fleetctl import secretenv
from fleetctl.container import Container
from fleetctl.errors import FleetError
from fleetctl.progress import Event, Progress
from fleetctl.soak.verdict import ContainerAccess, SoakTarget
from fleetctl.urls import REDACTED, redact_url

_BEARER = re.compile(r"(?i)\b(bearer)(\s+)([A-Za-z0-9._~+/=\-]{6,})")
_AUTH = re.compile(
    r"(?i)\b((?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)(?:basic\s+)?(?!bearer\s)([^\s\"',}]+)"
)
_HF = re.compile(r"\bhf_[A-Za-z0-9]{16,}")

T = TypeVar("T")


class Scrubber:
    """Replaces known secret values and credential shapes in strings (and dataclass trees)."""

    def __init__(self, values: Collection[str | None] = ()) -> None:
        # Longest first, so that a secret containing another is replaced whole.
        self.values = sorted({v for v in values if v and len(v) >= 4}, key=len, reverse=True)

    def __call__(self, s: str) -> str:
        """``s`` without any secret value or credential."""
        if not s:
            return s
        for v in self.values:
            if v in s:
                s = s.replace(v, REDACTED)
        low = s.lower()
        if "bearer" in low:
            s = _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", s)
        if "authorization" in low:
            s = _AUTH.sub(lambda m: f"{m.group(1)}{REDACTED}", s)
        if "hf_" in s:
            s = _HF.sub(REDACTED, s)
        return redact_url(s)

    def tree(self, obj: T) -> T:
        """``obj`` (a frozen dataclass tree, tuples, mappings, strings) with every string
        scrubbed."""
        return self._tree(obj)  # type: ignore[no-any-return]

    def _tree(self, obj: Any) -> Any:
        if isinstance(obj, str):
            return self(obj)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            changes = {f.name: self._tree(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                       if f.init and f.compare}
            return dataclasses.replace(obj, **changes)
        if isinstance(obj, tuple):
            return tuple(self._tree(v) for v in obj)
        if isinstance(obj, list):
            return [self._tree(v) for v in obj]
        if isinstance(obj, Mapping):
            return {k: self._tree(v) for k, v in obj.items()}
        return obj


def known_secrets(api_key: str | None, base_url: str = "",
                  environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The secret values a soak may be echoed: its API key, the controller's key and hub token, a
    URL password."""
    env = os.environ if environ is None else environ
    out: list[str] = [api_key] if api_key else []
    for name in (secretenv.API_KEY_ENV, secretenv.HUB_TOKEN_ENV):
        try:
            v = secretenv.lookup(name, env)
        except FleetError:
            v = None  # an unreadable file is reported where it is used; here it only cannot leak
        if v:
            out.append(v)
    try:
        password = urllib.parse.urlsplit(base_url).password
    except ValueError:
        password = None
    if password:
        out += [password, urllib.parse.unquote(password)]
    return tuple(out)


def validate_endpoint(url: str, where: str = "--endpoint", *, strict: bool = True) -> str:
    """``url`` when it is an http(s) URL without credentials; a FleetError (URL redacted) otherwise.

    ``strict=False`` refuses credentials only (the soak's own check of a URL the caller built).
    """
    shown = redact_url(url)
    try:
        u = urllib.parse.urlsplit(url)
        has_userinfo = u.username is not None or u.password is not None
        ok = (
            u.scheme in ("http", "https")
            and bool(u.hostname)
            and (u.port is None or 0 < u.port < 65536)
        )
    except ValueError:
        has_userinfo, ok = "@" in url, False
    if has_userinfo:
        raise FleetError(
            f"{where} {shown} carries a user name or password: it would end up in the run "
            "directory's name, progress, the verdict and the reports",
            fix="give the URL without user:pass@ and the key in $VLLM_API_KEY "
            "(or $VLLM_API_KEY_FILE), sent as Authorization: Bearer",
        )
    if strict and not ok:
        raise FleetError(f"{where} {shown!r} is not an http(s) URL with a host",
                         fix="e.g. --endpoint http://10.0.0.11:8000")
    return url


class _ScrubbedContainer:
    """Container access whose log lines are scrubbed (a server may print its key at start-up)."""

    def __init__(self, inner: ContainerAccess, scrub: Scrubber) -> None:
        self.inner = inner
        self.scrub = scrub

    def logs(self, tail: int = 50) -> str:
        return self.scrub(self.inner.logs(tail))

    def state(self) -> Container:
        return self.inner.state()


def scrubbed_target(target: SoakTarget, scrub: Scrubber) -> SoakTarget:
    """``target`` whose container log lines pass through ``scrub``."""
    if target.container is None or isinstance(target.container, _ScrubbedContainer):
        return target
    return dataclasses.replace(target, container=_ScrubbedContainer(target.container, scrub))


def scrubbed_progress(progress: Progress, scrub: Scrubber) -> Progress:
    """``progress`` receiving every event with its message and string data scrubbed."""
    def emit(event: Event) -> None:
        progress(Event(event.phase, scrub(event.message), event.host, scrub.tree(dict(event.data))))
    return emit
