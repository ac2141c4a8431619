"""Configuration of in-process instrumentation: histogram buckets, background polling, hardware peaks.

:class:`InstrumentConfig` is validated when it is built, so a bad bucket list fails at ``instrument()``
time with a message naming the field, never later inside a model's ``forward``.
:meth:`InstrumentConfig.from_env` reads the same fields from ``INFERWATCH_*`` environment variables (the
launcher's configuration path): the variable name is the field name upper-cased behind ``INFERWATCH_``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

ENV_PREFIX = "INFERWATCH_"


class ConfigError(ValueError):
    """Bad configuration of ``inferwatch run`` or ``inferwatch demo`` (an option, a variable, a directory);
    the message names it. The ``inferwatch`` dispatcher prints it in one line and exits with status 2."""


# Latency buckets follow the serving engines' conventions (vLLM, TGI) so dashboards and alerts written for
# them read these histograms the same way; all are in seconds.
DEFAULT_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
)  # fmt: skip
DEFAULT_ITL_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
    0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
#: Per-request token times (TPOT, the worst stall): read as p50/p99 on a dashboard, never by a rule, so a
#: coarser layout than the per-token ITL's, with 0.1 s (the ITL SLO's target, the panel's red line) kept.
DEFAULT_TPOT_BUCKETS = (
    0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
DEFAULT_E2E_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 120.0, 240.0, 480.0,
)  # fmt: skip
#: From the kernel's receipt of a request to the server's middleware: one scheduler tick (1-10 ms) is the
#: resolution of the receipt's time, so no bound below 5 ms.
DEFAULT_SOCKET_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
DEFAULT_FORWARD_BUCKETS = (
    0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048,
    4.096,
)  # fmt: skip
DEFAULT_TOKEN_BUCKETS = (
    1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072,
)  # fmt: skip
DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
#: Tokens of one forward pass by kind: read only as a mean (its _sum and _count), so powers of 4.
DEFAULT_STEP_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)


def _validate_buckets(field: str, buckets: Sequence[float]) -> tuple[float, ...]:
    try:
        values = tuple(float(b) for b in buckets)
    except (TypeError, ValueError):
        raise ValueError(f"{field}: bucket bounds must be numbers, got {buckets!r}") from None
    if not values:
        raise ValueError(f"{field}: needs at least one bucket bound")
    for value in values:
        if not math.isfinite(value) or value <= 0:
            raise ValueError(
                f"{field}: bucket bounds must be finite and > 0 (+Inf is added automatically), got {value!r}"
            )
    for low, high in itertools.pairwise(values):
        if high <= low:
            raise ValueError(f"{field}: bucket bounds must be strictly increasing, got {low!r} then {high!r}")
    return values


@dataclass(frozen=True)
class InstrumentConfig:
    """How :func:`~inferwatch.instrumentation.instrument` measures and what it exposes.

    Histogram families are shared by every model on one registry, so the first ``instrument()`` on a
    registry fixes their buckets; a later call on the same registry with different buckets raises
    ``ValueError``.
    """

    #: ``llm_time_to_first_token_seconds`` and ``llm_request_prefill_seconds``.
    ttft_buckets: tuple[float, ...] = DEFAULT_TTFT_BUCKETS
    #: ``llm_inter_token_latency_seconds``.
    itl_buckets: tuple[float, ...] = DEFAULT_ITL_BUCKETS
    #: ``llm_request_time_per_output_token_seconds``, ``llm_request_max_inter_token_latency_seconds``.
    tpot_buckets: tuple[float, ...] = DEFAULT_TPOT_BUCKETS
    #: ``llm_e2e_request_latency_seconds`` and ``llm_request_decode_seconds``.
    e2e_buckets: tuple[float, ...] = DEFAULT_E2E_BUCKETS
    #: ``llm_request_socket_wait_seconds``.
    socket_wait_buckets: tuple[float, ...] = DEFAULT_SOCKET_WAIT_BUCKETS
    #: ``llm_forward_seconds``.
    forward_buckets: tuple[float, ...] = DEFAULT_FORWARD_BUCKETS
    #: ``llm_request_prompt_tokens`` and ``llm_request_generation_tokens``.
    token_buckets: tuple[float, ...] = DEFAULT_TOKEN_BUCKETS
    #: ``llm_batch_size``.
    batch_buckets: tuple[float, ...] = DEFAULT_BATCH_BUCKETS
    #: ``llm_step_tokens``.
    step_token_buckets: tuple[float, ...] = DEFAULT_STEP_TOKEN_BUCKETS
    #: Period of the background sampler: allocator memory and retries, KV headroom, busy ratio, bandwidth
    #: and FLOP utilization windows, and NVML readings.
    poll_interval_seconds: float = 5.0
    #: Read the model's GPUs through NVML (when the library and a driver are present).
    enable_nvml: bool = True
    #: Peak memory bandwidth of the model's device in bytes/s; default: from NVML (bus width x max memory
    #: clock x 2). ``llm_decode_bandwidth_utilization_ratio`` is absent while this is unknown.
    peak_memory_bandwidth_bytes_per_second: float | None = None
    #: Peak dense FLOP/s of the model's device in its dtype; default: a table of common GPUs.
    #: ``llm_prefill_flops_utilization_ratio`` is absent while this is unknown.
    peak_flops: float | None = None
    #: An internal error of one stage is logged at most once per this many seconds (always counted).
    error_log_interval_seconds: float = 60.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if field.name.endswith("_buckets"):
                object.__setattr__(self, field.name, _validate_buckets(field.name, getattr(self, field.name)))
        for name in ("poll_interval_seconds", "error_log_interval_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name}: must be a number > 0, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name}: must be finite, got {value!r}")
        for name in ("peak_memory_bandwidth_bytes_per_second", "peak_flops"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ValueError(f"{name}: must be a finite number > 0 or None, got {value!r}")
        if not isinstance(self.enable_nvml, bool):
            raise ValueError(f"enable_nvml: must be True or False, got {self.enable_nvml!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> InstrumentConfig:
        """A config from ``INFERWATCH_<FIELD>`` variables; unset variables keep their defaults.

        Buckets are comma-separated numbers (``INFERWATCH_TTFT_BUCKETS=0.05,0.1,0.5``), booleans are
        ``1/0/true/false/yes/no/on/off``, and ``INFERWATCH_PEAK_FLOPS=`` (empty) means "unknown". A bad
        value raises ``ValueError`` naming the variable.
        """
        return from_variables(cls, environ, lambda name: ENV_PREFIX + name.upper(), _parse_field)

    @staticmethod
    def environment_variables() -> list[str]:
        """The names :meth:`from_env` reads, in field order."""
        return [ENV_PREFIX + field.name.upper() for field in dataclasses.fields(InstrumentConfig)]


def from_variables(
    cls: type[T],
    environ: Mapping[str, str] | None,
    variable: Callable[[str], str],
    parse: Callable[[str, str], Any],
    empty_is_unset: bool = False,
) -> T:
    """A dataclass of configuration from environment variables: field ``name`` from ``variable(name)``,
    its stripped text turned into a value by ``parse(name, text)``; unset variables (and, with
    ``empty_is_unset``, empty ones) keep their defaults. A bad value raises ``ValueError`` naming the
    variable: each is validated on its own (the dataclass checks its fields as it is built)."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        name = variable(field.name)
        raw = environ.get(name)
        if raw is None or (empty_is_unset and not raw.strip()):
            continue
        try:
            values[field.name] = parse(field.name, raw.strip())
            cls(**{field.name: values[field.name]})
        except ValueError as exc:
            raise ValueError(f"{name}={raw!r}: {exc}") from None
    return cls(**values)


def parse_bool(raw: str) -> bool:
    """A boolean variable's value: 1/0, true/false, yes/no or on/off."""
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected one of 1/0/true/false/yes/no/on/off")


def _parse_field(name: str, raw: str) -> Any:
    if name.endswith("_buckets"):
        return tuple(_number(part) for part in raw.split(",") if part.strip())
    if name == "enable_nvml":
        return parse_bool(raw)
    if name in ("peak_memory_bandwidth_bytes_per_second", "peak_flops") and raw == "":
        return None
    return _number(raw)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{text.strip()!r} is not a number") from None
