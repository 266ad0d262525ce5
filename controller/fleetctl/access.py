"""How fleetctl reaches a host and with what privilege: the inventory read as Ansible's ssh would.

A real fleet is reached as an admin user with sudo, often through a bastion. Ansible
expresses that with ``ansible_user``/``ansible_port``/``ansible_ssh_private_key_file``,
the ssh command-line options in ``ansible_ssh_common_args``/``ansible_ssh_extra_args``
(``-o ProxyJump=...``, ``-J``, ``-F``...), the operator's ``~/.ssh/config`` and the
``ansible_become*`` variables. This module turns those into one :class:`Route` (the
hops, each with its user, keys and known_hosts) and one :class:`Become`, with the
precedence OpenSSH applies to the command line Ansible builds: the ``ansible_*``
variables, then the options, then ssh_config. An option fleetctl cannot honour is
refused with one message rather than silently ignored; host keys are always verified.

Pure logic (no network): :mod:`fleetctl.ssh` connects along the route.
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko

from fleetctl.errors import FleetError, InventoryError

#: Longest ProxyJump chain followed through ssh_config (a loop of aliases must end).
MAX_HOPS = 8


class Secret:
    """A value that must never be shown: repr/str/format give ``<redacted>``; :meth:`reveal` gives
    it."""

    __slots__ = ("_missing", "_value")

    def __init__(self, value: str | None, missing: FleetError | None = None) -> None:
        self._value = value
        #: Why the value is unavailable (a vault-encrypted one without a vault password).
        self._missing = missing

    def reveal(self) -> str:
        """The value itself (only ever written to a channel's stdin), or the FleetError saying why
        not."""
        if self._value is None:
            raise self._missing or FleetError("the secret has no value")
        return self._value

    def __repr__(self) -> str:
        return "<redacted>"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return "<redacted>"

    def __copy__(self) -> Secret:
        return self

    def __deepcopy__(self, memo: Any) -> Secret:
        # immutable: dataclasses.asdict/replace of a Host share it rather than fail
        return self

    def __reduce__(self) -> Any:
        # a pickled Host (multiprocessing, a cache) must not carry the value either
        raise TypeError("a Secret cannot be pickled")


@dataclass(frozen=True)
class Hop:
    """One SSH connection of a route: where, as whom, with which keys, verified against which
    file."""

    address: str
    port: int = 22
    user: str = "root"
    #: Private keys to offer (then the agent's, as ssh does); empty: the agent and the default
    #: ~/.ssh keys.
    key_files: tuple[str, ...] = ()
    #: known_hosts file the host key must be in (None: ~/.ssh/known_hosts).
    known_hosts: str | None = None
    #: IdentitiesOnly: offer the key files alone, not the agent's keys.
    identities_only: bool = False

    @property
    def label(self) -> str:
        """``user@address:port`` for messages."""
        return f"{self.user}@{self.address}:{self.port}"

    def known_hosts_path(self) -> Path:
        """The known_hosts file this hop's key is checked against."""
        return Path(self.known_hosts or "~/.ssh/known_hosts").expanduser()


@dataclass(frozen=True)
class Become:
    """How commands that need root run (Ansible's ``ansible_become*``): only sudo is supported."""

    #: ``ansible_become`` as given (the direct path escalates per command when a caller asks).
    enabled: bool = False
    user: str = "root"
    method: str = "sudo"
    #: ``ansible_become_password`` (``ansible_become_pass``), never shown.
    password: Secret | None = field(default=None, compare=False)

    def check_method(self, host: str) -> None:
        """Raise unless the method is sudo, the one the direct SSH path can drive."""
        if self.method != "sudo":
            raise FleetError(
                f"ansible_become_method is {self.method!r}; fleetctl's direct SSH steps escalate "
                "with sudo only",
                host=host,
                fix="give the admin user sudo and set ansible_become_method: sudo",
            )


@dataclass(frozen=True)
class Route:
    """The target hop and the jump hosts in front of it, first hop first."""

    target: Hop
    jumps: tuple[Hop, ...] = ()
    #: ProxyCommand (its ``%h``/``%p``/``%r`` expanded) whose stdio carries the connection.
    proxy_command: str | None = None


@dataclass(frozen=True)
class SshArgs:
    """What ``ansible_ssh_common_args`` + ``ansible_ssh_extra_args`` say, first value of each
    kept."""

    user: str | None = None
    port: int | None = None
    hostname: str | None = None
    key_files: tuple[str, ...] = ()
    known_hosts: str | None = None
    proxy_jump: str | None = None
    #: ProxyCommand, when it came before any ProxyJump (ssh takes the first of the two).
    proxy_command: str | None = None
    identities_only: bool | None = None
    config_file: str | None = None


#: ssh options fleetctl leaves aside because its own behaviour already covers them (and why).
_IGNORED = {
    "controlmaster": "fleetctl pools its own connections",
    "controlpersist": "fleetctl pools its own connections",
    "controlpath": "fleetctl pools its own connections",
    "connecttimeout": "fleetctl bounds every connect itself",
    "serveraliveinterval": "fleetctl bounds every command itself",
    "serveralivecountmax": "fleetctl bounds every command itself",
    "forwardagent": "fleetctl never forwards the agent",
    "forwardx11": "fleetctl never forwards X11",
    "passwordauthentication": "fleetctl logs in with keys only",
    "kbdinteractiveauthentication": "fleetctl logs in with keys only",
    "challengeresponseauthentication": "fleetctl logs in with keys only",
    "gssapiauthentication": "fleetctl logs in with keys only",
    "pubkeyauthentication": "fleetctl logs in with keys only",
    "preferredauthentications": "fleetctl logs in with keys only",
    "batchmode": "fleetctl never prompts",
    "loglevel": "fleetctl reports its own errors",
    "compression": "a transport detail",
    "hashknownhosts": "fleetctl never writes known_hosts",
    "addkeystoagent": "fleetctl never changes the agent",
    "requesttty": "fleetctl runs commands without a tty",
    "tcpkeepalive": "a transport detail",
    "addressfamily": "a transport detail",
    "checkhostip": "the host key is verified against the name or address used",
    "updatehostkeys": "fleetctl never writes known_hosts",
}

#: ssh flags without an argument that change nothing fleetctl does.
_IGNORED_FLAGS = set("46ACTqtvxan")
#: ssh flags taking an argument that fleetctl honours.
_VALUE_FLAGS = {"o", "J", "F", "i", "l", "p"}

_FIX_ARGS = (
    "keep to ProxyJump/-J, User/-l, Port/-p, IdentityFile/-i, UserKnownHostsFile, "
    "StrictHostKeyChecking=yes and -F in ansible_ssh_common_args, or put the rest in ~/.ssh/config"
)


def parse_ssh_args(text: str, *, host: str, var: str = "ansible_ssh_common_args") -> SshArgs:
    """The options of an ssh command line fleetctl honours; anything else is one InventoryError."""
    try:
        words = shlex.split(text or "")
    except ValueError as e:
        raise InventoryError(
            f"{var} is not a valid shell word list ({e})", host=host, fix=_FIX_ARGS
        ) from None
    got: dict[str, Any] = {"identityfile": []}
    i = 0
    while i < len(words):
        w = words[i]
        i += 1
        if not w.startswith("-") or len(w) < 2:
            raise InventoryError(f"{var}: unexpected word {w!r}", host=host, fix=_FIX_ARGS)
        flag, rest = w[1], w[2:]
        if flag in _VALUE_FLAGS:
            if not rest:
                if i >= len(words):
                    raise InventoryError(f"{var}: -{flag} needs a value", host=host, fix=_FIX_ARGS)
                rest, i = words[i], i + 1
            if flag == "o":
                _option(*_split_option(rest, host, var), got, host, var)
            else:
                _option(_FLAG_KEYS[flag], rest, got, host, var)
            continue
        if all(c in _IGNORED_FLAGS for c in w[1:]):
            continue
        raise InventoryError(f"{var}: fleetctl's direct SSH cannot honour the ssh option {w!r}",
                             host=host, fix=_FIX_ARGS)
    return SshArgs(
        user=got.get("user"),
        port=got.get("port"),
        hostname=got.get("hostname"),
        key_files=tuple(got["identityfile"]),
        known_hosts=got.get("userknownhostsfile"),
        proxy_jump=_proxy(got, "jump"),
        proxy_command=_proxy(got, "command"),
        config_file=got.get("-F"),
        identities_only=got.get("identitiesonly"),
    )


def _proxy(got: dict[str, Any], kind: str) -> str | None:
    found = got.get("proxy")
    return found[1] if found and found[0] == kind else None


_FLAG_KEYS = {"J": "proxyjump", "F": "-F", "i": "identityfile", "l": "user", "p": "port"}


def _split_option(text: str, host: str, var: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        key, _, value = text.strip().partition(" ")
    key, value = key.strip().lower(), value.strip()
    if not key or not value:
        raise InventoryError(f"{var}: -o {text!r} is not Key=Value", host=host, fix=_FIX_ARGS)
    return key, value


def _option(key: str, value: str, got: dict[str, Any], host: str, var: str) -> None:
    """Record one option in ``got`` (ssh keeps the first value of each; IdentityFile
    accumulates)."""
    if key in ("user", "hostname", "-F"):
        got.setdefault(key, value)
    elif key in ("proxyjump", "proxycommand"):
        got.setdefault("proxy", (key.removeprefix("proxy"), value))
    elif key == "identitiesonly":
        got.setdefault(key, value.lower() in ("yes", "true"))
    elif key == "identityfile":
        got["identityfile"].append(value)
    elif key == "port":
        try:
            got.setdefault("port", int(value))
        except ValueError:
            raise InventoryError(
                f"{var}: port {value!r} is not a number", host=host, fix=_FIX_ARGS
            ) from None
    elif key == "userknownhostsfile":
        files = value.split()
        if len(files) != 1:
            raise InventoryError(
                f"{var}: UserKnownHostsFile names {len(files)} files; fleetctl verifies against "
                "one",
                host=host,
                fix="merge them into one file, or set fleetctl_known_hosts",
            )
        got.setdefault(key, files[0])
    elif key == "stricthostkeychecking":
        _strict(value, host, var)
    elif key not in _IGNORED:
        raise InventoryError(f"{var}: fleetctl's direct SSH cannot honour the ssh option {key}",
                             host=host, fix=_FIX_ARGS)


def _strict(value: str, host: str, where: str) -> None:
    if value.lower() not in ("yes", "true", "ask"):
        raise InventoryError(
            f"{where}: StrictHostKeyChecking {value} would accept an unknown host key; "
            "fleetctl always verifies host keys and never adds one",
            host=host,
            fix="remove the option (or set it to yes) and put the hosts' verified keys in "
                "known_hosts",
        )


def parse_jump(spec: str, *, host: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` (or ``ssh://...``, ``[v6]:port``) of one ProxyJump hop."""
    s = spec.strip().removeprefix("ssh://")
    user, _, hostport = s.rpartition("@")
    port: str | None = None
    if hostport.startswith("["):
        addr, _, rest = hostport[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None
    elif hostport.count(":") == 1:
        addr, _, port = hostport.partition(":")
    else:
        addr = hostport
    if not addr:
        raise InventoryError(
            f"ProxyJump {spec!r} names no host",
            host=host,
            fix="write the jump host as [user@]host[:port], several separated by commas",
        )
    try:
        return user or None, addr, int(port) if port else None
    except ValueError:
        raise InventoryError(f"ProxyJump {spec!r}: port {port!r} is not a number", host=host,
                             fix="write the jump host as [user@]host[:port]") from None


class _SshConfig(paramiko.SSHConfig):
    """paramiko's ssh_config, with ProxyCommand's tokens left for :func:`expand_proxy_command`:
    paramiko would put in ssh_config's port (22, not ``ansible_port``) and the name unquoted."""

    TOKENS_BY_CONFIG_KEY = {  # noqa: RUF012 (paramiko's own attribute, read only)
        k: list(v) for k, v in paramiko.SSHConfig.TOKENS_BY_CONFIG_KEY.items()
        if k != "proxycommand"}


_CONFIGS: dict[tuple[str, float], paramiko.SSHConfig] = {}


def ssh_config(path: str | None, *, host: str) -> paramiko.SSHConfig:
    """The ssh_config fleetctl resolves aliases with: ``-F path`` if given, else ``~/.ssh/config``.

    As with ``ssh -F``, an explicit file replaces the user's; /etc/ssh/ssh_config is not read
    (its Debian defaults are about environment and GSSAPI, nothing fleetctl uses).
    """
    p = Path(path or "~/.ssh/config").expanduser()
    try:
        mtime = p.stat().st_mtime
    except OSError:
        if path:
            raise InventoryError(f"ssh config file {p} (-F) does not exist", host=host,
                                 fix="fix the -F path in ansible_ssh_common_args") from None
        return _SshConfig()
    key = (str(p), mtime)
    if key not in _CONFIGS:
        try:
            _CONFIGS[key] = _SshConfig.from_path(str(p))
        except (OSError, ValueError) as e:
            raise InventoryError(
                f"cannot read ssh config {p}: {e}", host=host, fix="correct the file"
            ) from None
    return _CONFIGS[key]


def local_user() -> str:
    """The controller's login name: ssh's user when neither the inventory nor ssh_config names
    one."""
    return os.environ.get("USER") or getpass.getuser()


def _first(value: Any) -> str | None:
    if not value:
        return None
    text = value[0] if isinstance(value, list) else str(value)
    return str(Path(text.split()[0]).expanduser())


def _first_set(*values: bool | None) -> bool:
    return next((v for v in values if v is not None), False)


def _lookup(
    conf: paramiko.SSHConfig, alias: str, host: str, *, jump: bool = False
) -> dict[str, Any]:
    c: dict[str, Any] = dict(conf.lookup(alias))
    if "stricthostkeychecking" in c:
        _strict(str(c["stricthostkeychecking"]), host, f"ssh_config for {alias}")
    if (
        jump
        and "proxycommand" in c
        and str(c["proxycommand"]).lower() != "none"
        and "proxyjump" not in c
    ):
        raise InventoryError(
            f"ssh_config reaches jump host {alias} by a ProxyCommand, which fleetctl's "
            "direct SSH runs only for the host itself",
            host=host,
            fix="reach the jump host with ProxyJump instead of ProxyCommand",
        )
    return c


def expand_proxy_command(command: str, hop: Hop) -> str:
    """A ProxyCommand with ssh's ``%h``, ``%p``, ``%r`` and ``%%`` replaced for ``hop``.

    The command runs through /bin/sh: each value goes in shell-quoted (a no-op for the names
    :func:`check_name` lets through), so no part of a host or user name is read by the shell.
    """
    values = {"%h": shlex.quote(hop.address), "%p": str(hop.port), "%r": shlex.quote(hop.user)}
    return re.sub(r"%[hpr%]", lambda m: values.get(m[0], "%"), command)


#: What OpenSSH (9.6 and later) refuses in a host name: a leading '-', a quote, a shell
#: metacharacter, a comma, a space or a control character (misc.c, valid_hostname).
_BAD_HOST = re.compile(r"""^-|['`"$\\;&<>|(){},\s\x00-\x1f\x7f]""")
#: ... and in a user name (valid_ruser): a leading '-', a quote, a metacharacter other than
#: '$' and '\\', a control character, a space before a '-', a '\\' at the end.
_BAD_USER = re.compile(r"""^-|['`";&<>|(){}\x00-\x1f\x7f]|\s-|\\$""")


def check_name(value: str, *, what: str, host: str, user: bool = False) -> str:
    """``value`` when OpenSSH would take it as a host name (a user name if ``user``), else one
    InventoryError naming the host, the variable (``what``), the cause and the fix.

    A ProxyCommand (and ssh_config's ``Match exec``) hands these names to a shell: an
    ``ansible_host`` of ``10.0.0.5 `id```, taken as it is, would run ``id`` on the controller.
    """
    bad = (_BAD_USER if user else _BAD_HOST).search(value)
    if value and not bad:
        return value
    if not bad:
        why = "is empty"
    elif bad.start() == 0 and bad[0] == "-":
        why = "starts with '-'"
    elif len(bad[0]) == 2:
        why = "has a space before a '-'"
    elif bad[0] == "\\" and bad.end() == len(value):
        why = "ends with '\\'"
    else:
        why = f"contains {bad[0]!r}"
    kind, fix = ("user name", "the login name") if user else (
        "host name", "the host's DNS name or address")
    raise InventoryError(
        f"{what} {value!r} is not a valid {kind}: it {why}, which OpenSSH refuses too "
        "(a ProxyCommand would hand it to a shell)", host=host, fix=f"set {what} to {fix}")


#: Each connection variable and its older names, which Ansible still honours.
_ALIASES = {
    "host": ("ansible_host", "ansible_ssh_host"),
    "port": ("ansible_port", "ansible_ssh_port"),
    "user": ("ansible_user", "ansible_ssh_user"),
    "private_key_file": ("ansible_ssh_private_key_file", "ansible_private_key_file"),
}


def ansible_var(v: Mapping[str, Any], what: str) -> Any:
    """The value of connection variable ``what`` (``host``, ``port``, ``user``,
    ``private_key_file``)."""
    return next((v[k] for k in _ALIASES[what] if v.get(k) not in (None, "")), None)


def resolve_route(name: str, v: Mapping[str, Any]) -> Route:
    """The route to inventory host ``name`` from its variables (ansible_* > ssh options >
    ssh_config)."""
    common = parse_ssh_args(str(v.get("ansible_ssh_common_args") or ""), host=name)
    extra = parse_ssh_args(
        str(v.get("ansible_ssh_extra_args") or ""), host=name, var="ansible_ssh_extra_args"
    )
    conf = ssh_config(common.config_file or extra.config_file, host=name)
    host_var = "ansible_host" if ansible_var(v, "host") else "the inventory name"
    # before ssh_config is read: its Match exec runs a command with the name in it
    alias = check_name(str(ansible_var(v, "host") or name), what=host_var, host=name)
    c = _lookup(conf, alias, name)
    port_var = ansible_var(v, "port")
    try:
        port = int(
            port_var
            if port_var not in (None, "")
            else (common.port or extra.port or c.get("port") or 22)
        )
    except (TypeError, ValueError):
        raise InventoryError(
            f"ansible_port {port_var!r} is not a number", host=name, fix="set ansible_port: 22"
        ) from None
    key_var = ansible_var(v, "private_key_file")
    keys = tuple(
        dict.fromkeys(
            str(Path(str(k)).expanduser())
            for k in ([key_var] if key_var else [])
            + list(common.key_files)
            + list(extra.key_files)
            + list(c.get("identityfile") or [])
        )
    )
    known_var = v.get("fleetctl_known_hosts")
    known = (str(Path(str(known_var)).expanduser()) if known_var else None) or _first(
        common.known_hosts or extra.known_hosts) or _first(c.get("userknownhostsfile"))
    target = Hop(
        address=check_name(str(common.hostname or extra.hostname or c.get("hostname") or alias),
                           what="HostName", host=name),
        port=port,
        user=check_name(str(ansible_var(v, "user") or common.user or extra.user or c.get("user")
                            or local_user()),
                        what="ansible_user" if ansible_var(v, "user") else "User", host=name,
                        user=True),
        key_files=keys,
        known_hosts=known,
        identities_only=_first_set(common.identities_only, extra.identities_only,
                                   str(c.get("identitiesonly", "no")).lower() == "yes"),
    )
    if common.proxy_jump or common.proxy_command:
        spec, command = common.proxy_jump, common.proxy_command
    elif extra.proxy_jump or extra.proxy_command:
        spec, command = extra.proxy_jump, extra.proxy_command
    else:  # ssh_config: paramiko does not say which came first; ProxyJump is the usual one
        spec = c.get("proxyjump")
        command = None if spec else c.get("proxycommand")  # its %-tokens as written (_SshConfig)
    jumps = _jumps(str(spec), conf, target, name, 0) if spec and str(spec).lower() != "none" else ()
    proxy = (
        expand_proxy_command(str(command), target)
        if command and str(command).lower() != "none"
        else None
    )
    return Route(target, jumps, proxy)


def _jumps(
    spec: str, conf: paramiko.SSHConfig, target: Hop, name: str, depth: int
) -> tuple[Hop, ...]:
    """The hops of a ProxyJump list; the first one's own ProxyJump (ssh_config) goes in front of it.

    A hop without its own IdentityFile or UserKnownHostsFile in ssh_config uses the target's:
    one key and one known_hosts file for a fleet and its bastion is the common case.
    """
    if depth > MAX_HOPS:
        raise InventoryError(f"ProxyJump chain longer than {MAX_HOPS} hops (a loop in ssh_config?)",
                             host=name, fix="check the ProxyJump lines of ~/.ssh/config")
    hops: list[Hop] = []
    for i, part in enumerate(p for p in spec.split(",") if p.strip()):
        user, alias, port = parse_jump(part, host=name)
        c = _lookup(conf, check_name(alias, what="ProxyJump host", host=name), name, jump=True)
        front = c.get("proxyjump")
        if i == 0 and front and str(front).lower() != "none":
            hops.extend(_jumps(str(front), conf, target, name, depth + 1))
        keys = (
            tuple(str(Path(k).expanduser()) for k in c.get("identityfile") or ())
            or target.key_files
        )
        hops.append(
            Hop(
                address=check_name(
                    str(c.get("hostname") or alias), what="ProxyJump HostName", host=name
                ),
                port=int(port or c.get("port") or 22),
                user=check_name(
                    str(user or c.get("user") or local_user()),
                    what="ProxyJump user",
                    host=name,
                    user=True,
                ),
                key_files=keys,
                known_hosts=_first(c.get("userknownhostsfile")) or target.known_hosts,
                identities_only=str(c.get("identitiesonly", "no")).lower() == "yes"
                or target.identities_only,
            )
        )
    return tuple(hops)


_TRUE = {"yes", "y", "true", "t", "on", "1"}


def become_from_vars(v: Mapping[str, Any], password: Secret | None) -> Become:
    """Ansible's ``ansible_become*`` variables (the password already taken out of the vars)."""
    enabled = v.get("ansible_become", False)
    return Become(
        enabled=enabled is True or str(enabled).strip().lower() in _TRUE,
        user=str(v.get("ansible_become_user") or "root"),
        method=str(v.get("ansible_become_method") or "sudo").strip().lower(),
        password=password,
    )
