"""The soak names versions as people (and ``fleetctl status``) do: a digest-pinned container's tag
is its ``fleetctl.tag`` label, never the digest's hex; baselines are keyed by that tag; the HTML
report
shows the tag and the short digest."""

from __future__ import annotations

from typing import Any

from fleetctl.cli.soak import _tag_of
from fleetctl.container import Container, from_inspect
from fleetctl.soak import report
from fleetctl.soak.verdict import Outcome, Verdict

DIGEST = "sha256:" + "0123456789ab" + "cdef" * 13
TAG = "2026-07-01-v0.24.0"
STATE = {"Status": "running", "Running": True, "Restarting": False,
         "StartedAt": "2026-07-01T00:00:00Z"}


def parse_inspect(c: dict[str, Any], host: str, name: str) -> Container:
    """What DockerOverSSH reads (fleetctl.serving.inspect: the one parser of docker inspect)."""
    return from_inspect(c)


def _inspect(image: str, labels: dict[str, str] | None) -> dict[str, Any]:
    return {"Name": "/vllm", "State": STATE, "RestartCount": 0,
            "Config": {"Image": image, "Labels": labels}}


def test_a_digest_pinned_container_is_named_by_its_fleetctl_tag_label() -> None:
    st = parse_inspect(
        _inspect(f"10.0.0.1:5000/vllm@{DIGEST}", {"fleetctl.tag": TAG, "fleetctl.digest": DIGEST}),
        "spark-01",
        "vllm",
    )
    assert st.running and st.tag == TAG and st.digest == DIGEST


def test_without_labels_the_reference_gives_the_tag_and_never_the_digest_hex() -> None:
    assert parse_inspect(_inspect("reg/vllm:v0.23.0", None), "h", "vllm").tag == "v0.23.0"
    pinned = parse_inspect(_inspect(f"reg/vllm@{DIGEST}", {}), "h", "vllm")
    assert pinned.tag is None and pinned.digest == DIGEST


class _Container:
    """Container access answering a fixed state (what DockerOverSSH reads over SSH)."""

    def __init__(self, state: Container) -> None:
        self._state = state

    def logs(self, tail: int = 50) -> str:
        return ""

    def state(self) -> Container:
        return self._state


def test_the_soak_keys_baselines_by_the_tag_not_the_digest() -> None:
    st = parse_inspect(_inspect(f"reg/vllm@{DIGEST}", {"fleetctl.tag": TAG}), "h", "vllm")
    assert _tag_of(_Container(st)) == (TAG, DIGEST)
    assert _tag_of(None) == ("", "")


def _verdict(tag: str, digest: str) -> Verdict:
    return Verdict(
        run_id="soak-x",
        target="spark-01",
        base_url="http://h:8000",
        outcome=Outcome.PASS,
        summary="pass",
        started="2026-07-01T00:00:00+00:00",
        finished="2026-07-01T00:10:00+00:00",
        seconds=600.0,
        tag=tag,
        digest=digest,
    )


def test_the_html_report_shows_the_tag_and_the_short_digest() -> None:
    page = report.to_html([_verdict(TAG, DIGEST)])
    assert f"{TAG} @0123456789ab" in page and DIGEST not in page and DIGEST[7:] not in page
    # A verdict made before soaks read the label carries the hex as its tag: shortened, not shown
    # whole.
    old = report.to_html([_verdict(DIGEST[7:], "")])
    assert "@0123456789ab" in old and DIGEST[7:] not in old
