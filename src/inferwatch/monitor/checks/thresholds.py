"""The checks' thresholds, read from the alert configuration, so that a diagnosis agrees with the alerts.

:meth:`Thresholds.from_alerts` takes them from a validated configuration of the rules: the bundled
defaults (alerts/config.yaml), with the user's overrides merged over them when ``inferwatch diagnose
--alerts-config FILE`` names the file that ``inferwatch alerts render --config`` takes. Where a check
keeps a threshold of its own, its module says why next to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from inferwatch.alerts.config import load_config
from inferwatch.common.durations import parse_duration


@dataclass(frozen=True)
class Thresholds:
    """What each check judges against; each field names the alert setting it comes from."""

    #: InferwatchHostBound.busy_ratio_below: the model's kernels fill less of the wall time than this ...
    busy_ratio_below: float
    #: ... InferwatchHostBound.requests_running_above: while more requests than this run.
    requests_running_above: float
    #: InferwatchRequestsQueueing.requests_waiting_above: more requests than this waiting is a queue.
    requests_waiting_above: float
    #: InferwatchRequestStuck.age_seconds_above: a running request older than this has run too long.
    request_age_seconds_above: float
    #: InferwatchQueueTimeHigh.seconds_above: a p99 queue time above this is a queue.
    queue_seconds_above: float
    #: InferwatchGpuHardwareSlowdown.reasons: clocks-event reasons that mean the hardware cut the clocks.
    hardware_reasons: frozenset[str]
    #: InferwatchGpuClocksThrottled.reasons: reasons that mean the driver holds the clocks down.
    software_reasons: frozenset[str]
    #: InferwatchGpuThrottleDutyCycleHigh.reasons: violation counters that mean lost performance ...
    duty_cycle_reasons: frozenset[str]
    #: ... InferwatchGpuThrottleDutyCycleHigh.duty_cycle_ratio_above: the share of time they may take.
    duty_cycle_ratio_above: float
    #: InferwatchLatencyFluctuation.coefficient_of_variation_above.
    coefficient_of_variation_above: float
    #: InferwatchKvCacheHeadroomLow.headroom_tokens_below.
    headroom_tokens_below: float
    #: InferwatchKvCacheNearlyFull.used_ratio_above: requests hold more of a paged cache's blocks than this.
    kv_blocks_used_ratio_above: float
    #: InferwatchKvCachePreemptions.preemptions_above per its window: preempting faster than this.
    preemptions_per_second_above: float
    #: InferwatchMemoryLeak.growth_bytes_above per its lookback: the rate of growth that is a leak ...
    leak_bytes_per_second_above: float
    #: ... InferwatchMemoryLeak.load_growth_ratio: unless the token rate rose by more than this.
    load_growth_ratio: float

    @classmethod
    def from_alerts(cls, config: Mapping[str, Any]) -> Thresholds:
        """The thresholds of a validated alert configuration (what ``load_config`` returns)."""
        alerts = config["alerts"]
        host_bound, duty_cycle = alerts["InferwatchHostBound"], alerts["InferwatchGpuThrottleDutyCycleHigh"]
        fluctuation, leak = alerts["InferwatchLatencyFluctuation"], alerts["InferwatchMemoryLeak"]
        preemptions = alerts["InferwatchKvCachePreemptions"]
        return cls(
            busy_ratio_below=host_bound["busy_ratio_below"],
            requests_running_above=host_bound["requests_running_above"],
            requests_waiting_above=alerts["InferwatchRequestsQueueing"]["requests_waiting_above"],
            request_age_seconds_above=alerts["InferwatchRequestStuck"]["age_seconds_above"],
            queue_seconds_above=alerts["InferwatchQueueTimeHigh"]["seconds_above"],
            hardware_reasons=frozenset(alerts["InferwatchGpuHardwareSlowdown"]["reasons"]),
            software_reasons=frozenset(alerts["InferwatchGpuClocksThrottled"]["reasons"]),
            duty_cycle_reasons=frozenset(duty_cycle["reasons"]),
            duty_cycle_ratio_above=duty_cycle["duty_cycle_ratio_above"],
            coefficient_of_variation_above=fluctuation["coefficient_of_variation_above"],
            headroom_tokens_below=alerts["InferwatchKvCacheHeadroomLow"]["headroom_tokens_below"],
            kv_blocks_used_ratio_above=alerts["InferwatchKvCacheNearlyFull"]["used_ratio_above"],
            preemptions_per_second_above=preemptions["preemptions_above"]
            / parse_duration(preemptions["window"], promql=True),
            leak_bytes_per_second_above=leak["growth_bytes_above"]
            / parse_duration(leak["lookback"], promql=True),
            load_growth_ratio=leak["load_growth_ratio"],
        )

    @property
    def throttling_reasons(self) -> frozenset[str]:
        """Reasons whose 0/1 series, when 1, means the clocks are held down (not idle, not a setting)."""
        return self.hardware_reasons | self.software_reasons


@cache
def default_thresholds() -> Thresholds:
    """The thresholds of the bundled alert configuration (``inferwatch top``'s, which takes no config)."""
    return Thresholds.from_alerts(load_config())
