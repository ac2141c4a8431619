"""Suite-wide fixtures: GPU tests skip cleanly where there is no usable CUDA device, and the timing tier
(tests marked ``timing``) runs after every other test that was selected."""

from __future__ import annotations

import pytest

from tests.support import free_port


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Last: a test that bounds wall time or CPU share runs, and is reported, after every test that the
    # machine's load cannot fail. The sort keeps the order otherwise.
    items.sort(key=lambda item: "timing" in item.keywords)
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def port() -> int:
    return free_port()
