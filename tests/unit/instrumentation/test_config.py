"""InstrumentConfig: validation with clear messages, and the INFERWATCH_* environment variables."""

from __future__ import annotations

import math

import pytest

from inferwatch.instrumentation import InstrumentConfig


def test_defaults_are_valid_and_buckets_become_tuples() -> None:
    config = InstrumentConfig(itl_buckets=[0.001, 0.01, 1])
    assert config.itl_buckets == (0.001, 0.01, 1.0)
    assert config.enable_nvml and config.poll_interval_seconds > 0
    assert config.peak_flops is None and config.peak_memory_bandwidth_bytes_per_second is None


@pytest.mark.parametrize(
    ("buckets", "message"),
    [
        ([], "at least one"),
        ([0.1, 0.1], "strictly increasing"),
        ([1.0, 0.5], "strictly increasing"),
        ([-1.0, 1.0], "finite and > 0"),
        ([0.1, math.inf], "finite and > 0"),
        ([0.1, math.nan], "finite and > 0"),
        (["fast", "slow"], "must be numbers"),
        (None, "must be numbers"),
    ],
)
def test_bad_bucket_lists_are_refused(buckets, message) -> None:
    with pytest.raises(ValueError, match=f"ttft_buckets: .*{message}"):
        InstrumentConfig(ttft_buckets=buckets)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"poll_interval_seconds": 0},
        {"poll_interval_seconds": -1},
        {"poll_interval_seconds": math.inf},
        {"peak_flops": 0},
        {"peak_memory_bandwidth_bytes_per_second": -5.0},
        {"enable_nvml": "yes"},
        {"error_log_interval_seconds": True},
    ],
)
def test_bad_scalars_are_refused(kwargs) -> None:
    (field,) = kwargs
    with pytest.raises(ValueError, match=field):
        InstrumentConfig(**kwargs)


def test_from_env_reads_every_field() -> None:
    environ = {
        "INFERWATCH_TTFT_BUCKETS": "0.05, 0.1,0.5",
        "INFERWATCH_BATCH_BUCKETS": "1,8,64",
        "INFERWATCH_POLL_INTERVAL_SECONDS": "2.5",
        "INFERWATCH_ENABLE_NVML": "off",
        "INFERWATCH_PEAK_FLOPS": "989e12",
        "INFERWATCH_PEAK_MEMORY_BANDWIDTH_BYTES_PER_SECOND": "",
        "UNRELATED": "x",
    }
    config = InstrumentConfig.from_env(environ)
    assert config.ttft_buckets == (0.05, 0.1, 0.5)
    assert config.batch_buckets == (1.0, 8.0, 64.0)
    assert config.poll_interval_seconds == 2.5
    assert config.enable_nvml is False
    assert config.peak_flops == 989e12
    assert config.peak_memory_bandwidth_bytes_per_second is None
    assert InstrumentConfig.from_env({}) == InstrumentConfig()
    assert "INFERWATCH_ITL_BUCKETS" in InstrumentConfig.environment_variables()


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("INFERWATCH_ITL_BUCKETS", "0.1,abc", "'abc' is not a number"),
        ("INFERWATCH_ITL_BUCKETS", "0.5,0.1", "strictly increasing"),
        ("INFERWATCH_ENABLE_NVML", "maybe", "expected one of"),
        ("INFERWATCH_POLL_INTERVAL_SECONDS", "0", "> 0"),
    ],
)
def test_from_env_names_the_bad_variable(variable, value, message) -> None:
    with pytest.raises(ValueError, match=f"^{variable}=.*{message}"):
        InstrumentConfig.from_env({variable: value})
