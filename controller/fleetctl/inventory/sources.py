"""An inventory source read through ansible-core: its hosts and group variables with Ansible's
precedence, vault-encrypted values opened as ``ansible-playbook`` does, templated connection
variables rendered, passwords kept out of the variables as secrets."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fleetctl.access import (
    Hop,
    Route,
    Secret,
    ansible_var,
    become_from_vars,
    local_user,
    resolve_route,
)
from fleetctl.errors import FleetError, InventoryError
from fleetctl.inventory.host import _PASSWORD_VARS, Host
from fleetctl.inventory.units import UNIT_VAR

_FIX_FORMAT = ("see Ansible's inventory formats (YAML: all: hosts: / children: / vars:; INI: "
               "[group] host var=value)")


_NO_VAULT_FIX = (
    "pass --vault-password-file FILE or set ANSIBLE_VAULT_PASSWORD_FILE, as for ansible-playbook"
)


def _become_password(
    name: str, v: Mapping[str, Any], vault: str | None, loader: Any
) -> Secret | None:
    """``ansible_become_password`` as a :class:`Secret`; one that cannot be opened fails on use.

    The value may be vaulted, or (Ansible's usual indirection) a template naming a vaulted
    variable, ``"{{ vault_become_password }}"``: rendered as Ansible would, with the host's vars.
    """
    raw = next(
        (
            v[k]
            for k in ("ansible_become_password", "ansible_become_pass", "ansible_sudo_pass")
            if v.get(k) is not None
        ),
        None,
    )
    if raw is None:
        return None
    templated = isinstance(raw, str) and ("{{" in raw or "{%" in raw)
    if not templated and not _is_vaulted(raw):
        return Secret(str(raw))
    try:
        if templated:
            from ansible.template import Templar

            return Secret(str(Templar(loader=loader, variables=v).template(raw)))
        return Secret(format(raw, ""))
    except (
        Exception
    ):  # not quoted: ansible's errors may quote the template or the ciphertext's origin
        if vault is None:
            return Secret(
                None,
                FleetError(
                    "ansible_become_password is vault-encrypted and no vault password was given",
                    host=name,
                    fix=_NO_VAULT_FIX,
                ),
            )
        return Secret(
            None,
            FleetError(
                f"ansible_become_password cannot be {'rendered' if templated else 'decrypted'} "
                f"with the vault password in {vault}",
                host=name,
                fix="give the vault password file the value was encrypted with, and check the "
                    "variable it names",
            ),
        )


#: The variables that say how to reach a host: rendered when they are templates, as a play would.
_CONNECTION_VARS = (
    "ansible_host",
    "ansible_ssh_host",
    "ansible_port",
    "ansible_ssh_port",
    "ansible_user",
    "ansible_ssh_user",
    "ansible_ssh_private_key_file",
    "ansible_private_key_file",
    "ansible_ssh_common_args",
    "ansible_ssh_extra_args",
    "ansible_become",
    "ansible_become_user",
    "ansible_become_method",
    "fleetctl_known_hosts",
)


def _render_connection_vars(v: Mapping[str, Any], loader: Any) -> tuple[dict[str, str], str | None]:
    """The connection variables that are templates (``"{{ inventory_hostname }}.lan"``, ``-J {{
    bastion }}``),
    rendered with the host's variables; or why one cannot be."""
    out: dict[str, str] = {}
    templar = None
    for k in _CONNECTION_VARS:
        value = v.get(k)
        if isinstance(value, str) and ("{{" in value or "{%" in value):
            from ansible.template import Templar

            templar = templar or Templar(loader=loader, variables=v)
            try:
                out[k] = str(templar.template(value))
            except (
                Exception
            ) as e:  # undefined variable, vaulted value without the vault password...
                return (
                    out,
                    f"{k} {str(value)!r} cannot be rendered: {' '.join(str(e).split())[:200]}",
                )
    return out, None


def _secret_names(v: Mapping[str, Any]) -> set[str]:
    """The password variables, and those their templates name (``vault_become_password``)."""
    names = set(_PASSWORD_VARS)
    for k in _PASSWORD_VARS:
        if isinstance(v.get(k), str):
            names.update(
                re.findall(r"[A-Za-z_][A-Za-z0-9_]*", " ".join(re.findall(r"{{(.*?)}}", v[k])))
            )
    return names


def _is_vaulted(value: Any) -> bool:
    from ansible.parsing.vault import EncryptedString

    return isinstance(value, EncryptedString)


def _unvault(value: Any, vault: str | None) -> Any:
    """Vault-encrypted values decrypted (as Ansible gives them to a play), or marked when they
    cannot be."""
    if isinstance(value, Mapping):
        return {k: _unvault(x, vault) for k, x in value.items()}
    if isinstance(value, list | tuple):
        return [_unvault(x, vault) for x in value]
    if _is_vaulted(value):
        if vault is None:
            return "<vault-encrypted: no vault password given>"
        try:
            return format(value, "")
        except Exception:
            return f"<vault-encrypted: cannot be decrypted with {vault}>"
    return value


def _internal_vars() -> frozenset[str]:
    from ansible import constants as C

    # the magic variables Ansible adds per host (groups, omit, playbook_dir...) are
    # dropped exactly as `ansible-inventory --list` drops them
    return frozenset(C.INTERNAL_STATIC_VARS) | {
        "groups",
        "group_names",
        "inventory_hostname",
        "inventory_hostname_short",
        "omit",
        "inventory_file",
        "inventory_dir",
        "playbook_dir",
        "ansible_playbook_python",
        "ansible_config_file",
        "ansible_version",
        "ansible_facts",
        "ansible_check_mode",
        "ansible_diff_mode",
        "ansible_forks",
        "ansible_inventory_sources",
        "ansible_skip_tags",
        "ansible_run_tags",
        "ansible_verbosity",
        "ansible_limit",
        "ansible_play_hosts",
        "ansible_play_batch",
        "ansible_play_hosts_all",
        "ansible_search_path",
        "ansible_collection_name",
        "ansible_role_names",
        "ansible_play_role_names",
        "ansible_dependent_role_names",
        "ansible_play_name",
        "environment",
        "vars",
        "hostvars",
    }


def ansible_load(p: Path, vault_password_file: str | os.PathLike[str] | None = None
                 ) -> tuple[Any, Any, str | None]:
    """ansible-core's InventoryManager and VariableManager over ``p``, and the vault password file
    used."""
    from ansible import constants as C
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    # an unparsable source must fail loudly; Ansible's default only warns and
    # leaves an empty inventory, which would silently select no host
    C.INVENTORY_ANY_UNPARSED_IS_FAILED = True
    C.INVENTORY_UNPARSED_IS_FAILED = True
    from ansible.plugins.vars import host_group_vars

    # the group_vars/host_vars plugin caches which files exist per directory for
    # the life of the process (right for one ansible-playbook run); a long-lived
    # controller must see a vars file added or removed since the last load
    host_group_vars.FOUND.clear()
    loader = DataLoader()
    vault = _vault_secrets(loader, vault_password_file or beside_vault_password_file(p))
    with ansible_warnings() as warnings:
        try:
            manager = InventoryManager(loader=loader, sources=[str(p)])
            variables = VariableManager(loader=loader, inventory=manager)
        except AnsibleError as e:
            warnings.append(str(e))
    if warnings:
        # every plugin reports why it refused the file; the one for its format says the real cause
        likely = "'yaml' plugin" if p.suffix in (".yml", ".yaml") else "'ini' plugin"
        cause = next((w for w in warnings if likely in w), warnings[0])
        raise InventoryError(
            f"{p}: ansible-core cannot read this inventory: {' '.join(cause.split())}",
            fix=f"check it with `ansible-inventory -i {p} --list`; {_FIX_FORMAT}",
        )
    return manager, variables, vault


#: The Ansible configuration an inventory may keep beside it (its directory's ``ansible.cfg``).
BESIDE_CFG = "ansible.cfg"


def beside_vault_password_file(p: Path) -> str | None:
    """``vault_password_file`` of the ``ansible.cfg`` beside inventory ``p`` (in its directory, or
    in ``p`` itself when it is a directory of sources), unless ``$ANSIBLE_VAULT_PASSWORD_FILE``
    names one; a relative path is taken from that directory. None when there is none.

    ``ansible-playbook`` reads an ``ansible.cfg`` from the directory it runs in; an inventory kept
    with its own (the lab's, or a fleet repository's ``inventory/ansible.cfg``) then works from
    anywhere. As Ansible does with a world-writable current directory, a configuration in a
    world-writable directory is ignored: anyone could name a program there as the vault password.
    """
    import configparser

    if os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE"):
        return None
    d = p if p.is_dir() else p.parent
    cfg = d / BESIDE_CFG
    try:
        if not cfg.is_file() or d.stat().st_mode & 0o002:
            return None
        parser = configparser.ConfigParser(interpolation=None)
        parser.read_string(cfg.read_text(encoding="utf-8"), source=str(cfg))
    except (OSError, UnicodeDecodeError, configparser.Error) as e:
        raise InventoryError(f"{cfg}: {' '.join(str(e).split())}",
                             fix="correct the ansible.cfg beside the inventory (an INI file)"
                             ) from None
    named = parser.get("defaults", "vault_password_file", fallback="").strip()
    if not named:
        return None
    return str((d / Path(named).expanduser()).resolve())


def _vault_secrets(loader: Any, explicit: str | os.PathLike[str] | None) -> str | None:
    """Give ansible-core the vault password ``ansible-playbook`` would use; returns its file, or
    None: ``explicit`` (``--vault-password-file``, or the ``ansible.cfg`` beside the inventory),
    else ``$ANSIBLE_VAULT_PASSWORD_FILE``, else Ansible's own configuration's."""
    from ansible import constants as C
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import VaultSecretsContext, get_file_vault_secret

    path = (
        explicit or os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE") or C.DEFAULT_VAULT_PASSWORD_FILE
    )
    secrets: list[tuple[str, Any]] = []
    if path:
        path = str(Path(path).expanduser())
        try:
            secret = get_file_vault_secret(
                filename=path, vault_id=C.DEFAULT_VAULT_IDENTITY, loader=loader
            )
            secret.load()
        except AnsibleError as e:
            raise InventoryError(
                f"vault password file {path}: {' '.join(str(e).split())}",
                fix="give a readable file holding the vault password (or an executable printing "
                    "it)",
            ) from None
        secrets.append((C.DEFAULT_VAULT_IDENTITY, secret))
    loader.set_vault_secrets(secrets)
    # ansible-core reads the secrets of an encrypted value from one process-wide context, set once
    # per ansible-playbook run; a long-lived controller may load again with another file
    ctx = VaultSecretsContext.current(optional=True)
    if ctx is None:
        VaultSecretsContext.initialize(VaultSecretsContext(secrets))
    else:
        ctx.secrets = secrets
    return path or None


@contextlib.contextmanager
def ansible_warnings() -> Iterator[list[str]]:
    """Collect what ansible-core would print as warnings, instead of printing it.

    Ansible skips a malformed group or host with a warning on stderr and goes on;
    for a fleet that is a silently smaller fleet, so the caller turns them into
    one error (and the core never prints).
    """
    from ansible.utils.display import Display

    display = Display()
    warnings: list[str] = []

    def collect(msg: str, *_: Any, **kw: Any) -> None:
        exc = kw.get("exception")
        warnings.append(f"{msg} {exc}".strip() if exc else msg)

    saved = display.__dict__.get("warning"), display.__dict__.get("error_as_warning")
    display.warning = collect
    display.error_as_warning = collect
    try:
        yield warnings
    finally:
        for name, was in zip(("warning", "error_as_warning"), saved, strict=True):
            if was is None:
                display.__dict__.pop(name, None)
            else:
                setattr(display, name, was)


def group_vars(manager: Any, group: Any, vault: str | None) -> dict[str, Any]:
    from ansible.utils.vars import combine_vars
    from ansible.vars.plugins import get_vars_from_inventory_sources

    raw = combine_vars(
        group.get_vars(),
        get_vars_from_inventory_sources(manager._loader, manager._sources, [group], "all"),
    )
    secret = _secret_names(raw)
    raw = {k: x for k, x in raw.items() if k not in secret}
    out: dict[str, Any] = _plain(_unvault(raw, vault))
    return out


def _plain(value: Any) -> Any:
    """Ansible 2.19's trust-tagged str/int/dict subclasses as plain Python values."""
    return json.loads(json.dumps(value, default=str))


def _plain_vars(
    raw: Mapping[str, Any], vault: str | None, memo: dict[int, tuple[Any, Any]]
) -> dict[str, Any]:
    """:func:`_plain` of :func:`_unvault` of each variable, each shared value converted once per
    load.

    Ansible gives every host of a group the same objects for the group's variables (the recipes
    of group_vars/all are one dict for 10,000 hosts): converting them once, not once per host, is
    most of the time an inventory of thousands of hosts takes to load, and a long string is held
    once, not once per host (a 4 MiB one in a group of 200 hosts took 888 MB). Host.vars are
    read-only, so hosts may share the converted values. The memo holds the originals, so an id is
    never reused.
    """
    out: dict[str, Any] = {}
    for k, v in raw.items():
        if isinstance(v, Mapping | list | tuple | str):
            hit = memo.get(id(v))
            if hit is None or hit[0] is not v:
                hit = memo[id(v)] = (v, _plain(_unvault(v, vault)))
            out[k] = hit[1]
        else:
            out[k] = _plain(_unvault(v, vault))
    return out


#: A host's name in the inventory (its alias, Ansible's inventory_hostname): a DNS name, a short
#: name with ``_`` (``gpu_node_3``), an IPv4 or IPv6 address. The name reaches ssh's command line,
#: file names under the state directory and every table; ``/``, a space, a newline or shell
#: characters have no place there.
_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,252}")


def _check_name(path: Path, name: str) -> None:
    """Refuse a host name outside :data:`_HOST_NAME`, naming it (quoted: it may hold a newline)."""
    if _HOST_NAME.fullmatch(name):
        return
    odd = sorted({c for c in name if not (c.isascii() and (c.isalnum() or c in "_.:-"))})
    what = ("characters " + " ".join(repr(c) for c in odd[:8]) if odd
            else "a leading '.', '-' or ':'" if name else "no characters")
    raise InventoryError(
        f"{path}: host name {name[:80]!r} has {what}, which a host name may not hold",
        fix="name hosts with letters, digits, '.', '-' and '_' (an IPv6 address: ':' too), "
            "starting with a letter, digit or '_', at most 253 characters; put the address in "
            "ansible_host",
    )


def _make_host(path: Path, name: str, v: Mapping[str, Any], groups: tuple[str, ...],
               password: Secret | None = None, render_error: str | None = None) -> Host:
    try:
        if render_error:
            raise InventoryError(
                render_error, host=name, fix="define the variables it names for this host"
            )
        route = resolve_route(name, v)
        route_error = None
    except InventoryError as e:
        # only fleetctl's direct SSH needs the route: playbooks (ssh itself) still run, and
        # the first direct step on this host raises this
        route_error = InventoryError(f"{path}: {e.cause}", host=name, fix=e.fix)
        try:
            port = int(ansible_var(v, "port") or 22)
        except (TypeError, ValueError):
            raise InventoryError(
                f"{path}: ansible_port {ansible_var(v, 'port')!r} is not a number",
                host=name,
                fix="set ansible_port: 22",
            ) from None
        route = Route(
            Hop(
                str(ansible_var(v, "host") or name),
                port,
                str(ansible_var(v, "user") or local_user()),
            )
        )
    t = route.target
    if not 1 <= t.port <= 65535:
        # paramiko would wrap 99999 into another port (34463) and call -5 "Servname not supported".
        raise InventoryError(
            f"{path}: ansible_port {t.port} is not a TCP port (1-65535)",
            host=name,
            fix="set ansible_port to the host's SSH port, usually 22",
        )
    return Host(
        name=name,
        address=t.address,
        port=t.port,
        user=t.user,
        key_file=t.key_files[0] if t.key_files else None,
        known_hosts=t.known_hosts,
        groups=groups,
        vars=dict(v),
        key_files=t.key_files,
        jumps=route.jumps,
        identities_only=t.identities_only,
        proxy_command=route.proxy_command,
        become=become_from_vars(v, password),
        route_error=route_error,
    )


def read_hosts(p: Path, manager: Any, variables: Any, vault: str | None) -> dict[str, Host]:
    """Every host of the source as fleetctl sees it: its variables merged with Ansible's precedence,
    passwords kept apart as secrets, connection variables rendered."""
    hosts: dict[str, Host] = {}
    internal = _internal_vars()
    memo: dict[int, tuple[Any, Any]] = {}
    for h in manager.get_hosts("all"):
        _check_name(p, h.name)
        raw = dict(variables.get_vars(host=h, include_hostvars=False, stage="all"))
        password = _become_password(h.name, raw, vault, variables._loader)
        rendered, render_error = _render_connection_vars(raw, variables._loader)
        # the magic variables go first: `groups` alone lists every host, for every host
        for name in _secret_names(raw) | internal:
            raw.pop(name, None)
        merged = {**_plain_vars(raw, vault, memo), **rendered}
        groups = tuple(g.name for g in h.get_groups() if g.name not in ("all", "ungrouped"))
        hosts[h.name] = _make_host(p, h.name, merged, groups, password, render_error)
    return hosts


def declared_units(manager: Any, hosts: Mapping[str, Host], vault: str | None) -> dict[str, Any]:
    """Each group's own ``fleetctl_unit`` (without Ansible's precedence), for the groups holding a
    unit member: read only when there are members (no cost without units)."""
    members = {n for n, h in hosts.items() if h.vars.get(UNIT_VAR)}
    return {
        name: v
        for name, g in manager.groups.items()
        if members
        and name not in ("all", "ungrouped")
        and members.intersection(x.name for x in g.get_hosts())
        and (v := group_vars(manager, g, vault).get(UNIT_VAR)) is not None
    }
