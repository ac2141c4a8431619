"""A profile capture leaves nothing behind on a real GPU: the serving process's throughput after it, and
its exit.

The serving process of ``tests/benchmarks/gpu_profile_after.py`` (a 1B Llama decoding back to back on a
thread, instrumented, its endpoint taking captures), asked for one 20-step capture with ``inferwatch
profile``. Kineto left CUPTI attached after the trace before inferwatch set ``TEARDOWN_CUPTI=1``, which
slowed this loop to 0.71-0.77 of its speed for as long as the process ran. The benchmark holds the 0.98
bound over a minute; a test on a shared host holds a looser one over half of it. Run:
``python -m pytest tests/gpu/test_profile_gpu.py -v``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks.gpu_profile_after import run_variant

pytestmark = pytest.mark.gpu


def test_a_capture_costs_nothing_once_it_ends(tmp_path: Path) -> None:
    row = run_variant("inferwatch", before=10.0, after=30.0, out=tmp_path)
    assert "error" not in row, row.get("error")
    assert row["capture_lines"] and row["capture_lines"][0].startswith("capture: 0"), row["capture_lines"]
    assert row["exit_status"] == 0, row
    assert not [line for line in row["bad_lines"] if "terminate called" in line], row["bad_lines"]
    assert row["after_ratio_median"] >= 0.95, row["after_ratio"]
