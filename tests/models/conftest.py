"""Fixtures of the model tests: `device`, where a Triton kernel's test runs (tests/models/test_cuda_ops.py and
test_tree_kernels.py)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    """cpu: Triton's interpreter (tests/conftest.py chooses it where there is no GPU); cuda: the compiled kernel."""
    if (request.param == "cpu") != (os.environ.get("TRITON_INTERPRET") == "1"):
        pytest.skip("Triton runs compiled kernels or its interpreter in one process, not both")
    return request.param
