"""The lab's wedge faults on a node's serving container (``fleetctl lab node NAME --wedge``,
``--unwedge``, ``--wedge-after-start S``): the engine stops producing tokens while /health and
/metrics still answer (``lab/emulator/wedge.py`` does it inside the emulator).

They act on the running container, not on the node: a restart of the container heals a wedge, as
on a real Spark. ``--wedge-after-start S`` writes S into the container's own filesystem, so every
later start of that same container wedges again S seconds after it is ready (what a circuit
breaker is for), while another container (a rollback's) does not. ``--unwedge`` clears both, in
stopped containers too (a rollback keeps the wedging one as ``.prev``).
"""

from __future__ import annotations

import shlex

from fleetctl.errors import FleetError
from fleetctl.lab import nodes
from fleetctl.lab.dockerd import Dockerd
from fleetctl.lab.emulator.wedge import AFTER_START_FILE
from fleetctl.lab.lab_state import existing, read_state
from fleetctl.progress import NULL, Event, Progress

WEDGE, UNWEDGE, AFTER_START = "wedge", "unwedge", "wedge-after-start"


def _serving(engine: Dockerd, node: str) -> list[str]:
    """The node's running vLLM containers (the lab's images: AEON's and the stock vllm-openai)."""
    from fleetctl.lab.scenarios import AEON_REPOSITORY, STOCK_REPOSITORY

    return [c.name for c in nodes.inner_containers(engine, node)
            if any(repo in c.image for repo in (AEON_REPOSITORY, STOCK_REPOSITORY))]


def _clear_stopped(engine: Dockerd, node: str) -> None:
    """Empty the wedge-after-start file of every stopped vLLM container on the node (a rollback
    keeps the one it left as ``.prev``, and a later rollback may start it again): ``docker cp``
    reaches a stopped container's filesystem, ``docker exec`` does not."""
    from fleetctl.lab.scenarios import AEON_REPOSITORY, STOCK_REPOSITORY

    repos = "|".join((AEON_REPOSITORY, STOCK_REPOSITORY))
    f = shlex.quote(AFTER_START_FILE)
    script = (": > /tmp/fleetctl-lab-empty; docker ps -a --filter status=exited --filter "
              "status=created --format '{{.ID}} {{.Image}}' | grep -E " + shlex.quote(repos)
              + " | while read -r c _; do docker cp /tmp/fleetctl-lab-empty \"$c:\"" + f
              + " || true; done")
    nodes.exec_(engine, node, ["sh", "-c", script], what="clearing stopped containers' wedge")


def apply(name: str, action: str, seconds: float | None = None,
          progress: Progress = NULL) -> list[str]:
    """Wedge, unwedge or wedge-after-start every vLLM container running on node ``name``; returns
    their names. Raises FleetError naming the node when none runs (nothing to wedge)."""
    lay = existing()
    state = read_state(lay)
    if name not in state.get("nodes", []):
        raise FleetError(f"no lab node {name!r}", fix="use one of: "
                         f"{', '.join(state.get('nodes', [])) or '(none: run `fleetctl lab up`)'}")
    engine = Dockerd(lay)
    if engine.pid() is None:
        raise FleetError("the lab is down", fix="run `fleetctl lab up`")
    if action == UNWEDGE:
        _clear_stopped(engine, name)
    vllm = _serving(engine, name)
    if not vllm:
        raise FleetError(f"--{action}: no vLLM container runs on the node", host=name,
                         fix="serve a version there first (`fleetctl rollout`)")
    f = shlex.quote(AFTER_START_FILE)
    for c in vllm:
        q = shlex.quote(c)
        if action == WEDGE:
            script = f"docker kill --signal USR1 {q} >/dev/null"
        elif action == UNWEDGE:
            script = f"docker kill --signal USR2 {q} >/dev/null"
        elif action == AFTER_START and seconds is not None:
            script = (f"docker exec {q} sh -c 'echo {float(seconds):g} > {f}' && "
                      f"docker kill --signal HUP {q} >/dev/null")
        else:
            raise ValueError(f"unknown wedge action {action!r}")
        nodes.exec_(engine, name, ["sh", "-c", script], what=f"{action} of {c}")
    detail = f" {seconds:g}s" if action == AFTER_START and seconds is not None else ""
    progress(Event(action, f"{', '.join(vllm)}{detail}", host=name))
    return vllm
