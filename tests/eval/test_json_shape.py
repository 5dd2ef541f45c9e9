"""Records read back from JSON: a value a summary would divide by zero with is no record (`json_shape` bounds)."""

from dataclasses import asdict

import pytest

from specgen.decoding.stats import DecodeStats
from specgen.eval import json_shape
from specgen.eval.image_rows import Image
from specgen.eval.mesh_bench import MeshRun

STATS = asdict(DecodeStats(new_tokens=3, target_forwards=3, times={"prefill": 0.01, "verify": 0.02}))


@pytest.mark.parametrize("times, why", [
    ({"prefill": 0.01, "verify": -0.001}, "x.stats.times.verify is -0.001, not >= 0"),
    ({"prefill": 0.0, "verify": 0.0}, "x.stats.times is {'prefill': 0.0, 'verify': 0.0}, not sum > 0"),
    ({}, "x.stats.times is {}, not sum > 0"),
    ({"prefill": "1"}, "x.stats.times.prefill is a string, not float"),
])
@pytest.mark.parametrize("run", [
    {"tokens": [1, 2, 3], "shard": "0-of-1"},  # an image
    {"tokens": 3, "valid": True, "cd": None, "hd": None, "shard": "0-of-1"},  # a mesh
], ids=["image", "mesh"])
def test_a_decode_without_positive_phase_times_is_no_record(run, times, why):
    """An image or mesh row's speed divides by its stats' wall time, the sum of its phase times: a record whose
    times are empty, zero or negative failed `benchmark report` with a ZeroDivisionError or gave negative speeds."""
    cls = Image if isinstance(run["tokens"], list) else MeshRun
    assert json_shape.fault({**run, "stats": STATS}, cls, "x") is None  # control: the measured stats read
    ended = {**STATS, "times": {"prefill": 0.01, "propose": 0.0}}  # a row that ended before drafting again
    assert json_shape.fault({**run, "stats": ended}, cls, "x") is None
    assert json_shape.fault({**run, "stats": {**STATS, "times": times}}, cls, "x") == why


def test_a_bound_is_named_by_its_base_type():
    from typing import Annotated
    assert json_shape.name(list[Annotated[float, "> 0"]]) == "list[float]"
    assert json_shape.fault([1.0, 0], list[Annotated[float, "> 0"]], "w") == "w[1] is 0, not > 0"
