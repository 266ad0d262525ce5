#!/usr/bin/python
"""Ansible module: the recipe's vLLM serving container on one host, rendered like fleetctl's
rollout.

Why a module of our own and not community.docker.docker_container: Ansible Galaxy is
unreachable from the machines that build and test fleetctl (only PyPI and Debian are), so
community.docker cannot be installed there, and the collection must not depend on it. The
container also has to match what ``fleetctl rollout`` starts (controller/fleetctl/rollout/host.py)
bit for bit - same name, image by digest, flags, mounts, env names and labels, the previous
container kept as ``<name>.prev`` - so that the controller and a playbook can take turns on
the same fleet. This module renders that ``docker run`` from the raw recipe and drives the
docker CLI with ``module.run_command``; it reads the host's state with ``docker inspect`` and
changes nothing when the running container already matches (check mode and diff supported).

Secrets: values in ``secrets`` reach ``docker run`` through its environment (``-e NAME``
with no value), never its argv; the module's argument is no_log.
"""

from __future__ import annotations

import hashlib
import json
import re

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: vllm_container
short_description: Run a fleetctl recipe's vLLM container by digest, keeping the previous one as NAME.prev
description:
  - Renders the serving container of a fleetctl recipe exactly as C(fleetctl rollout) does.
  - C(state=started) makes NAME run the recipe from IMAGE@DIGEST; a different running container under NAME is
    stopped and kept as NAME.prev (an older NAME.prev is removed). A NAME that is not running while NAME.prev
    exists is removed instead and NAME.prev kept (it is the last version that served), as the controller's
    retire does. Nothing changes when NAME already runs the same settings (the C(fleetctl.rollout) label aside).
  - C(state=previous) puts NAME.prev back as NAME and starts it (a rollback); the container it replaces
    is removed, as the controller's restore does.
options:
  name: {type: str, default: vllm, description: The serving container's name.}
  state: {type: str, default: started, choices: [started, previous], description: What to make true.}
  recipe_name: {type: str, description: The recipe's key in fleetctl_recipes (label fleetctl.recipe).}
  recipe: {type: dict, description: The raw recipe from fleetctl_recipes.}
  digest: {type: str, description: The image digest to serve (sha256:...).}
  tag: {type: str, description: The tag the digest was resolved from (label fleetctl.tag); default the digest's first 19 characters.}
  registry_mirrors: {type: dict, default: {}, description: fleetctl_registry_mirrors (registry -> mirror host).}
  rollout: {type: str, default: ansible, description: Label fleetctl.rollout; not compared.}
  extra_labels: {type: dict, default: {}, description: More labels (e.g. fleetctl.fingerprint); compared.}
  compile_cache_key: {type: str, default: "", description: "The host's compile-cache key: the recipe's compile_cache dirs mounted from COMPILE_CACHE_ROOT/RECIPE/KEY/NAME (fleetctl.warmcache)."}
  secrets: {type: dict, default: {}, no_log: true, description: Values of the recipe's secret_env names.}
  stop_timeout: {type: int, default: 30, description: Seconds docker stop waits before killing.}
author: fleetctl
"""  # noqa: E501 (data: lines as the program reads them)

RETURN = r"""
container: {description: The serving container's redacted settings after the run (none when absent)., type: dict}
previous: {description: The redacted settings of NAME.prev after the run (none when absent)., type: dict}
actions: {description: What was done (or would be, in check mode), in order., type: list}
differences: {description: The settings that differed and made the container be replaced., type: list}
ref: {description: The image reference pulled and run (registry or mirror, by digest)., type: str}
argv: {description: The docker run argv (secret names only, never values)., type: list}
"""  # noqa: E501 (data: lines as the program reads them)

PREV_SUFFIX = ".prev"
LABEL_RECIPE, LABEL_TAG, LABEL_DIGEST, LABEL_ROLLOUT, LABEL_IMAGE, LABEL_FINGERPRINT = (
    "fleetctl.recipe", "fleetctl.tag", "fleetctl.digest", "fleetctl.rollout", "fleetctl.image",
    "fleetctl.fingerprint")
DOCKER_HUB = "docker.io"
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
#: The restart policy fleetctl gives the container (rollout/host.py RESTART_POLICY): a rebooted
#: host serves again, a container stopped or killed on purpose stays down. The recipe's docker_args
#: may override it.
RESTART_POLICY = "unless-stopped"
#: Labels that say which run started a container, not how it runs: a change alone restarts nothing.
_UNCOMPARED_LABELS = (LABEL_ROLLOUT,)
#: Where a host keeps its compile caches, and the variable naming the key (fleetctl.warmcache's
#: ROOT, KEY_ENV).
COMPILE_CACHE_ROOT = "/var/cache/fleetctl/compile"
COMPILE_CACHE_KEY_ENV = "FLEETCTL_COMPILE_CACHE_KEY"


# ---- rendering (pure: unit-tested against the controller's run_argv)
# --------------------------------


def pull_ref(image: str, digest: str, mirrors: dict[str, str] | None = None) -> str:
    """``<mirror or registry>/<repository>@<digest>``, as fleetctl.registry.pull_ref."""
    name = image.split("@", 1)[0]
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, repo = first, rest
    else:
        registry, repo = DOCKER_HUB, (name if "/" in name else "library/" + name)
    mirror = (mirrors or {}).get(registry)
    if mirror:
        return "{}/{}@{}".format(str(mirror).split("://", 1)[-1].rstrip("/"), repo, digest)
    short = (
        repo[len("library/") :] if registry == DOCKER_HUB and repo.startswith("library/") else repo
    )
    return "{}@{}".format(short if registry == DOCKER_HUB else registry + "/" + repo, digest)


def _has_flag(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def _env_value(v: object) -> str:
    # YAML's true/false reach the container as the controller writes them: lower case.
    return str(v).lower() if isinstance(v, bool) else str(v)


def _mounts(recipe: dict) -> list[list[str]]:
    return [
        [str(w["path"]).rstrip("/"), str(w["mount"]).rstrip("/")]
        for w in recipe.get("weights") or []
    ]


def _cache_binds(recipe_name: str, recipe: dict, key: str) -> list[list[str]]:
    if not key:
        return []
    return [
        [
            "{}/{}/{}/{}".format(COMPILE_CACHE_ROOT, recipe_name, key, c["name"]),
            str(c["mount"]).rstrip("/"),
        ]
        for c in recipe.get("compile_cache") or []
    ]


def _env(recipe_name: str, recipe: dict, key: str) -> dict:
    env = {str(k): _env_value(v) for k, v in (recipe.get("env") or {}).items()}
    if key and recipe.get("compile_cache"):
        env[COMPILE_CACHE_KEY_ENV] = key
    return env


def _serve(recipe: dict) -> list[str]:
    body = next(w for w in recipe.get("weights") or [] if w.get("role") == "body")
    vllm_args = [str(a) for a in recipe.get("vllm_args") or []]
    serve = ["serve", str(body["mount"]).rstrip("/"), "--served-model-name",
             *[str(n) for n in recipe.get("served_model_names") or []], *vllm_args]
    if not _has_flag(vllm_args, "--port"):
        serve += ["--port", str(recipe.get("port", 8000))]
    return serve


def restart_policy(recipe: dict) -> str:
    """The policy docker applies: the last --restart of the recipe's docker_args, else
    RESTART_POLICY.

    Returned as docker inspect names it (``on-failure:3`` is ``on-failure``).
    """
    policy = RESTART_POLICY
    args = [str(a) for a in recipe.get("docker_args") or []]
    for i, a in enumerate(args):
        if a == "--restart" and i + 1 < len(args):
            policy = args[i + 1]
        elif a.startswith("--restart="):
            policy = a.split("=", 1)[1]
    return policy.split(":", 1)[0]


def fingerprint(recipe: dict) -> str:
    """The container settings' fingerprint, as fleetctl.rollout.host.fingerprint computes it.

    sha256 of the canonical JSON of docker_args, entrypoint, env, mounts, the default restart
    policy, secret env NAMES and the serve argv: a recipe-only change (flags, env, mounts) changes
    it whatever the image.
    """
    doc = {
        "docker_args": [str(a) for a in recipe.get("docker_args") or []],
        "entrypoint": "vllm",
        "env": {str(k): _env_value(v) for k, v in (recipe.get("env") or {}).items()},
        "mounts": _mounts(recipe),
        "restart": RESTART_POLICY,
        "secret_env": sorted(str(k) for k in recipe.get("secret_env") or []),
        "serve": _serve(recipe),
    }
    return hashlib.sha256(
        json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def render(recipe_name: str, recipe: dict, ref: str, tag: str, digest: str, rollout: str,
           name: str, extra_labels: dict | None = None, cache_key: str = "") -> list[str]:
    """The ``docker run`` argv for the recipe, the same as fleetctl.rollout.host.run_argv."""
    argv = [
        "docker",
        "run",
        "-d",
        "--name",
        name,
        "--gpus",
        "all",
        "--ipc",
        "host",
        "--network",
        "host",
        "--restart",
        RESTART_POLICY,
        "--label",
        f"{LABEL_RECIPE}={recipe_name}",
        "--label",
        f"{LABEL_TAG}={tag}",
        "--label",
        f"{LABEL_DIGEST}={digest}",
        "--label",
        f"{LABEL_ROLLOUT}={rollout}",
        "--label",
        f"{LABEL_IMAGE}={recipe['image']}",
        "--label",
        f"{LABEL_FINGERPRINT}={fingerprint(recipe)}",
    ]
    for k, v in sorted((extra_labels or {}).items()):
        argv += ["--label", f"{k}={v}"]
    argv += [str(a) for a in recipe.get("docker_args") or []]
    for src, dst in _mounts(recipe):
        argv += ["-v", f"{src}:{dst}:ro"]
    for src, dst in _cache_binds(recipe_name, recipe, cache_key):
        argv += ["-v", f"{src}:{dst}"]
    for k, v in _env(recipe_name, recipe, cache_key).items():
        argv += ["-e", f"{k}={v}"]
    for k in container_secret_names(recipe):
        argv += ["-e", k]
    return [*argv, "--entrypoint", "vllm", ref, *_serve(recipe)]


def container_secret_names(recipe: dict) -> list[str]:
    """The recipe's secret_env without HF_TOKEN: weights are staged before, so a serving container
    never
    needs the hub token (and anyone in the docker group could read it with docker inspect)."""
    return [str(k) for k in recipe.get("secret_env") or [] if str(k) != "HF_TOKEN"]


def wanted(
    recipe_name: str,
    recipe: dict,
    ref: str,
    tag: str,
    digest: str,
    extra_labels: dict | None,
    secret_names: list[str],
    cache_key: str = "",
) -> dict:
    """The settings ``docker inspect`` must show for the container to count as already right."""
    argv = render(recipe_name, recipe, ref, tag, digest, "", "x", extra_labels, cache_key)
    cmd = argv[argv.index(ref) + 1:]
    labels = {
        LABEL_RECIPE: recipe_name,
        LABEL_TAG: tag,
        LABEL_DIGEST: digest,
        LABEL_IMAGE: recipe["image"],
        LABEL_FINGERPRINT: fingerprint(recipe),
    }
    labels.update({str(k): str(v) for k, v in (extra_labels or {}).items()})
    env = _env(recipe_name, recipe, cache_key)
    return {
        "image": ref,
        "entrypoint": ["vllm"],
        "cmd": cmd,
        "env": env,
        "secret_env_names": sorted(secret_names),
        "binds": sorted(
            [f"{src}:{dst}:ro" for src, dst in _mounts(recipe)]
            + [f"{src}:{dst}" for src, dst in _cache_binds(recipe_name, recipe, cache_key)]
        ),
        "network_mode": "host",
        "ipc_mode": "host",
        "gpus": True,
        "restart": restart_policy(recipe),
        "labels": labels,
        "running": True,
    }


def observed(c: dict | None, compare_env: dict, secret_names: list[str]) -> dict | None:
    """The same view of an inspected container (env values only for the names compared, never
    secrets)."""
    if not c:
        return None
    cfg = c.get("Config") or {}
    hc = c.get("HostConfig") or {}
    env_all = dict(str(e).partition("=")[::2] for e in cfg.get("Env") or [])
    labels = {k: v for k, v in (cfg.get("Labels") or {}).items()
              if k.startswith("fleetctl.") and k not in _UNCOMPARED_LABELS}
    return {
        "image": cfg.get("Image"),
        "entrypoint": cfg.get("Entrypoint"),
        "cmd": cfg.get("Cmd"),
        "env": {k: env_all[k] for k in compare_env if k in env_all},
        "secret_env_names": sorted(k for k in secret_names if k in env_all),
        "binds": sorted(hc.get("Binds") or []),
        "network_mode": hc.get("NetworkMode"),
        "ipc_mode": hc.get("IpcMode"),
        "gpus": bool(hc.get("DeviceRequests")),
        "restart": (hc.get("RestartPolicy") or {}).get("Name") or "no",
        "labels": labels,
        "running": _running(c),
    }


def _running(c: dict) -> bool:
    # Docker counts a container waiting out its restart back-off as Running: it serves nothing.
    state = c.get("State") or {}
    return bool(state.get("Running")) and not state.get("Restarting")


def differences(want: dict, have: dict | None) -> list[str]:
    """Which settings differ (names only: values may be long, and env values stay out of logs)."""
    if have is None:
        return ["(no container)"]
    out = []
    for k in want:
        if k == "secret_env_names":
            # A secret the controller has no value for is left unset by docker run: absent is fine.
            if not set(have[k]) <= set(want[k]):
                out.append(k)
        elif k == "labels":
            out += [
                "label " + lk
                for lk in sorted(set(want[k]) | set(have[k]))
                if want[k].get(lk) != have[k].get(lk)
            ]
        elif k == "env":
            out += ["env " + ek for ek in sorted(want[k]) if want[k][ek] != have[k].get(ek)]
        elif want[k] != have[k]:
            out.append(k)
    return out


def retire_plan(
    cur_running: bool | None,
    cur_rollout: str | None,
    cur_digest: str | None,
    prev_exists: bool,
    rollout: str,
    digest: str,
) -> str:
    """What happens to NAME (and NAME.prev) before the new container runs; the controller's retire
    decides alike.

    ``none``: no container in the way. ``remove``: NAME is not running, or is this run's own
    half-started container, while NAME.prev exists: NAME.prev is the last version that served, so
    NAME is removed and NAME.prev kept (a deploy repeated after a failed start or a killed
    controller never deletes the last good container). ``keep``: NAME is stopped and kept as
    NAME.prev, an older NAME.prev removed first (the running one is the newer known version).
    ``cur_running`` is None when there is no NAME.
    """
    if cur_running is None:
        return "none"
    if prev_exists and (not cur_running or (cur_rollout == rollout and cur_digest == digest)):
        return "remove"
    return "keep"


def summary(c: dict | None) -> dict | None:
    """A container's settings for reports and diffs: no env values at all."""
    if not c:
        return None
    cfg = c.get("Config") or {}
    hc = c.get("HostConfig") or {}
    state = c.get("State") or {}
    labels = cfg.get("Labels") or {}
    return {
        "name": str(c.get("Name", "")).lstrip("/"),
        "running": _running(c),
        "status": state.get("Status"),
        "image": cfg.get("Image"),
        "digest": labels.get(LABEL_DIGEST),
        "tag": labels.get(LABEL_TAG),
        "recipe": labels.get(LABEL_RECIPE),
        "rollout": labels.get(LABEL_ROLLOUT),
        "entrypoint": cfg.get("Entrypoint"),
        "cmd": cfg.get("Cmd"),
        "env_names": sorted(str(e).split("=", 1)[0] for e in cfg.get("Env") or []),
        "binds": hc.get("Binds"),
        "network_mode": hc.get("NetworkMode"),
        "ipc_mode": hc.get("IpcMode"),
        "gpus": bool(hc.get("DeviceRequests")),
        "labels": {k: v for k, v in labels.items() if k.startswith("fleetctl.")},
    }


def _text(s: dict | None) -> str:
    return json.dumps(s, indent=2, sort_keys=True) + "\n" if s else ""


# ---- the module
# ------------------------------------------------------------------------------------


class Docker:
    """The docker CLI on the host, failing the module with the command's own error."""

    def __init__(self, module) -> None:
        self.m = module

    def run(self, argv: list[str], what: str, fix: str, env: dict | None = None) -> str:
        rc, out, err = self.m.run_command(argv, environ_update=env or {})
        if rc != 0:
            self.m.fail_json(msg=f"{what} failed: {(err or out).strip()[-400:]} (fix: {fix})")
        return str(out)

    def inspect(self, name: str) -> dict | None:
        rc, out, _ = self.m.run_command(["docker", "container", "inspect", name])
        if rc != 0:
            return None  # no such container
        data = json.loads(out)
        return data[0] if data else None

    def has_image(self, ref: str) -> bool:
        rc, _, _ = self.m.run_command(["docker", "image", "inspect", "--format", "{{.Id}}", ref])
        return bool(rc == 0)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", default="vllm"),
            state=dict(type="str", default="started", choices=["started", "previous"]),
            recipe_name=dict(type="str"),
            recipe=dict(type="dict"),
            digest=dict(type="str"),
            tag=dict(type="str"),
            registry_mirrors=dict(type="dict", default={}),
            rollout=dict(type="str", default="ansible"),
            extra_labels=dict(type="dict", default={}),
            compile_cache_key=dict(type="str", default=""),
            secrets=dict(type="dict", default={}, no_log=True),
            stop_timeout=dict(type="int", default=30),
        ),
        required_if=[("state", "started", ("recipe_name", "recipe", "digest"))],
        supports_check_mode=True,
    )
    p = module.params
    docker = Docker(module)
    name, prev_name = p["name"], p["name"] + PREV_SUFFIX
    cur, prev = docker.inspect(name), docker.inspect(prev_name)
    actions: list[str] = []
    before = {"container": summary(cur), "previous": summary(prev)}

    if p["state"] == "previous":
        if prev is None:
            module.fail_json(
                msg="there is no {} to roll back to ({} serves {})".format(
                    prev_name, name, (summary(cur) or {}).get("image") or "nothing"
                )
                + " (fix: deploy the wanted tag with deploy.yml -e vllm_serve_tag=TAG -e "
                  "vllm_serve_digest=DIGEST)"
            )
        actions = (["remove " + name] if cur is not None else []) + [
            f"rename {prev_name} to {name}",
            "start " + name,
        ]
        if not module.check_mode:
            if cur is not None:
                docker.run(
                    ["docker", "rm", "-f", name], "removing " + name, "see the docker daemon's log"
                )
            docker.run(
                ["docker", "rename", prev_name, name],
                "renaming " + prev_name,
                "see the docker daemon's log",
            )
            docker.run(["docker", "start", name], "starting " + name,
                       f"read `docker logs {name}`; the previous version failed to start")
        after_c = docker.inspect(name) if not module.check_mode else prev
        after = {"container": summary(after_c), "previous": None}
        module.exit_json(
            changed=True,
            actions=actions,
            differences=[],
            ref=(summary(prev) or {}).get("image"),
            argv=[],
            container=after["container"],
            previous=None,
            diff={
                "before": _text(before),
                "after": _text(after),
                "before_header": name,
                "after_header": name,
            },
        )

    recipe, digest = p["recipe"], p["digest"]
    if not _DIGEST.match(digest or ""):
        module.fail_json(
            msg=f"digest {digest!r} is not sha256:<64 hex digits> (fix: pass the digest fleetctl "
                "or "
            "`docker buildx imagetools inspect` prints for the tag)"
        )
    weights = recipe.get("weights") or []
    if not recipe.get("image") or sum(1 for w in weights if w.get("role") == "body") != 1:
        module.fail_json(
            msg="recipe {} has no image or not exactly one body weight set (fix: `fleetctl recipes "
            "check` names the problem)".format(p["recipe_name"])
        )
    tag = p["tag"] or digest[:19]
    ref = pull_ref(recipe["image"], digest, p["registry_mirrors"])
    secret_names = container_secret_names(recipe)
    argv = render(p["recipe_name"], recipe, ref, tag, digest, p["rollout"], name, p["extra_labels"],
                  p["compile_cache_key"])
    want = wanted(p["recipe_name"], recipe, ref, tag, digest, p["extra_labels"], secret_names,
                  p["compile_cache_key"])
    diff_names = differences(want, observed(cur, want["env"], secret_names))
    if not diff_names:
        module.exit_json(changed=False, actions=[], differences=[], ref=ref, argv=argv,
                         container=summary(cur), previous=summary(prev))

    have_image = docker.has_image(ref)
    if not have_image:
        actions.append("pull " + ref)
    cur_labels = ((cur or {}).get("Config") or {}).get("Labels") or {}
    plan = retire_plan(
        None if cur is None else _running(cur),
        cur_labels.get(LABEL_ROLLOUT),
        cur_labels.get(LABEL_DIGEST),
        prev is not None,
        p["rollout"],
        digest,
    )
    # A stopped container already rendered right with no NAME.prev (the host rebooted, or docker
    # stop by hand): start it. With a NAME.prev, the retire rule below removes it and runs a fresh
    # one.
    only_stopped = cur is not None and diff_names == ["running"] and prev is None
    if only_stopped:
        actions.append("start " + name)
    elif plan == "remove":
        actions += [
            f"remove {name} (not serving; {prev_name} is the last version that served)",
            "run " + name,
        ]
    elif plan == "keep":
        actions += (["remove " + prev_name] if prev is not None else []) + [
            f"stop {name} and keep it as {prev_name}", "run " + name]
    else:
        actions.append("run " + name)
    if not module.check_mode:
        if not have_image:
            docker.run(["docker", "pull", "-q", ref], "docker pull " + ref,
                       "check the registry mirror (fleetctl_registry_mirrors) and the host's disk")
        if only_stopped:
            docker.run(["docker", "start", name], "starting " + name, f"read `docker logs {name}`")
        else:
            # The same steps, in the same order, as the controller's retire (rollout/host.py), so
            # that a run cut anywhere leaves a state the controller's resume already handles.
            if plan == "remove":
                docker.run(["docker", "rm", "-f", name], "removing the half-started " + name,
                           "see the docker daemon's log")
            elif plan == "keep":
                if prev is not None:
                    docker.run(
                        ["docker", "rm", "-f", prev_name],
                        "removing " + prev_name,
                        "see the docker daemon's log",
                    )
                docker.run(
                    ["docker", "stop", "-t", str(p["stop_timeout"]), name],
                    "stopping " + name,
                    "see the docker daemon's log",
                )
                docker.run(["docker", "rename", name, prev_name], f"keeping {name} as {prev_name}",
                           "see the docker daemon's log")
            env = {
                k: str(v)
                for k, v in (p["secrets"] or {}).items()
                if k in secret_names and v not in (None, "")
            }
            docker.run(
                argv,
                "docker run " + name,
                "read the error above; the previous container is kept as " + prev_name,
                env=env,
            )
        cur_after, prev_after = docker.inspect(name), docker.inspect(prev_name)
    else:
        cur_after = None
        prev_after = cur if plan == "keep" and not only_stopped else prev
    after = {
        "container": summary(cur_after)
        if cur_after
        else {"image": ref, "cmd": want["cmd"], "labels": want["labels"], "running": True},
        "previous": summary(prev_after),
    }
    module.exit_json(changed=True, actions=actions, differences=diff_names, ref=ref, argv=argv,
                     container=after["container"], previous=summary(prev_after),
                     diff={"before": _text(before), "after": _text(after),
                           "before_header": name, "after_header": name})


if __name__ == "__main__":
    main()
