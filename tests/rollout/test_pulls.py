"""A pull's bytes: docker's own lines (as a lab node printed them) against the registry's layer
sizes."""

from __future__ import annotations

from fleetctl.rollout.pulls import PullMeter

A = "sha256:64641e29547f553904658a2053421881e2108316dfbc5ac71c17929b0eb57076"
B = "sha256:4df02ae89cd181bbd3f468b6ffd7da8fbd94cc011c200c59f55d6627e99931ab"
#: `docker pull` without a terminal on a lab node (docker 26), as captured.
LINES = """cu130-nightly: Pulling from vllm/vllm-openai
64641e29547f: Pulling fs layer
4df02ae89cd1: Pulling fs layer
4df02ae89cd1: Verifying Checksum
4df02ae89cd1: Download complete
64641e29547f: Download complete
64641e29547f: Pull complete
4df02ae89cd1: Pull complete
Digest: sha256:50e81fbe65e8bb9a39ffe08db826b54fa3e87c55e7ff5542ca443ea533519abf
Status: Downloaded newer image for 10.78.36.1:5000/vllm/vllm-openai:cu130-nightly""".splitlines()


def test_the_bytes_grow_a_layer_at_a_time_to_the_images_size() -> None:
    meter = PullMeter([{A: 42_811_397, B: 40_006}])
    seen = []
    for line in LINES:
        if meter.feed(line):
            f = meter.figures()
            seen.append((f["bytes"], f["layers"]))
    # Bytes as layers are downloaded; then the layers as they are extracted.
    assert seen == [(0, 0), (0, 0), (40_006, 0), (42_851_403, 0), (42_851_403, 1), (42_851_403, 2)]
    assert meter.figures() == {
        "bytes": 42_851_403,
        "bytes_total": 42_851_403,
        "layers": 2,
        "layers_total": 2,
    }
    assert meter.message() == "42.9 MB of 42.9 MB, 2/2 layers extracted"


def test_layers_already_there_count_and_an_image_up_to_date_is_whole() -> None:
    meter = PullMeter([{A: 42_811_397, B: 40_006}])
    meter.feed("64641e29547f: Already exists")
    assert meter.figures()["bytes"] == 42_811_397 and meter.figures()["layers"] == 1
    up = PullMeter([{A: 42_811_397, B: 40_006}])
    assert up.feed("Status: Image is up to date for 10.78.36.1:5000/vllm/vllm-openai@sha256:50e8")
    assert up.figures() == {
        "bytes": 42_851_403,
        "bytes_total": 42_851_403,
        "layers": 2,
        "layers_total": 2,
    }


def test_the_platform_is_the_one_whose_layers_the_pull_names() -> None:
    arm = {"sha256:" + "a" * 64: 3_000_000_000, B: 40_006}
    amd = {A: 42_811_397, "sha256:" + "b" * 64: 10}
    meter = PullMeter([arm, amd])
    assert meter.figures()["bytes_total"] is None, "not known before the pull names a layer"
    meter.feed("64641e29547f: Pulling fs layer")
    assert meter.figures()["bytes_total"] == 42_811_407


def test_without_sizes_the_layers_are_counted_and_other_lines_change_nothing() -> None:
    meter = PullMeter([])
    assert not meter.feed("Digest: sha256:50e81fbe65e8")
    assert not meter.feed("not a docker line at all")
    meter.feed("64641e29547f: Pulling fs layer")
    meter.feed("4df02ae89cd1: Pull complete")
    assert meter.figures() == {"bytes": None, "bytes_total": None, "layers": 1, "layers_total": 2}
    assert meter.message() == "1/2 layers extracted"
