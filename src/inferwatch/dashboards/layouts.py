"""The three dashboards of the design brief, as rows of panels from the modules of :mod:`.panels`.

* Inference overview: what the serving process measures - latency percentiles, queueing, throughput,
  errors, the queue/prefill/decode breakdown and the tokens of each step, KV cache (a paged cache's blocks
  and preemptions too), how busy the model keeps its device, and the clocks of the GPU it runs on.
* GPU hardware: what NVML says about every GPU - load, memory, power, temperature, clocks and why
  they are low, and the fault counters.
* Diagnosis: the questions of the reference notes' bottleneck matrix and fault list, each answered by
  panels side by side - is latency following the clocks, is memory running out, is the host the
  bottleneck, and is the monitoring itself healthy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.cog import builder as cog
from grafana_foundation_sdk.models import dashboard as models

from inferwatch.common import names
from inferwatch.common.promql import Selector, one_of, regex

from .grafana import datasource_variable, query_variable, stat_panel, state_timeline_panel, timeseries_panel
from .panels import (
    efficiency,
    gpu_clocks,
    gpu_faults,
    gpu_load,
    latency,
    memory,
    monitoring,
    prefill_decode,
    queries,
    throughput,
)

TAG = "inferwatch"
Section = tuple[str, Sequence[cog.Builder[models.Panel]]]


def _variables() -> list[cog.Builder[models.VariableModel]]:
    # Instances of serving processes and of exporters both: one selection filters either kind of panel.
    # (One selector cannot hold both jobs' configured matchers: this one names the two metrics only.)
    info = Selector("", (regex("__name__", one_of([names.LLM_MODEL_INFO, names.GPU_INFO])),))
    models = queries.serving_instance(names.LLM_MODEL_INFO)
    gpus = queries.exporter_instance(names.GPU_INFO)
    return [
        datasource_variable(),
        query_variable("instance", "Instance", f"label_values({info.render()}, instance)"),
        query_variable("model", "Model", f"label_values({models.render()}, model)"),
        query_variable("gpu", "GPU", f"label_values({gpus.render()}, gpu)"),
    ]


def _dashboard(uid: str, title: str, description: str, sections: Sequence[Section]) -> models.Dashboard:
    builder = (
        dashboard_builders.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG])
        .timezone("browser")
        .refresh("30s")
        .time("now-1h", "now")
        .tooltip(models.DashboardCursorSync.CROSSHAIR)
        .link(
            dashboard_builders.DashboardLink("inferwatch")
            .type(models.DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
        .variables(_variables())
    )
    for row_title, row_panels in sections:
        builder = builder.with_row(dashboard_builders.Row(row_title))
        for panel in row_panels:
            builder = builder.with_panel(panel)
    dashboard = builder.build()
    # Grafana needs ids unique within a dashboard; the builder leaves them all 0.
    for panel_id, panel in enumerate(dashboard.panels or [], start=1):
        panel.id_val = panel_id
    return dashboard


def overview() -> models.Dashboard:
    return _dashboard(
        "inferwatch-overview",
        "inferwatch / Inference overview",
        "Latency, queueing, throughput, errors, queue/prefill/decode time and tokens, and KV cache of "
        "instrumented models.",
        [
            (
                "Latency",
                [
                    timeseries_panel(latency.time_to_first_token()),
                    timeseries_panel(latency.queue_time()),
                    timeseries_panel(throughput.requests_waiting(), min_value=0),
                    timeseries_panel(latency.inter_token_latency()),
                    timeseries_panel(latency.end_to_end_latency()),
                    timeseries_panel(latency.per_request_token_time()),
                    timeseries_panel(latency.first_token_against_first_content(), width=24),
                    timeseries_panel(
                        latency.per_model_over_replicas(), width=24, no_value=latency.NO_RECORDED_QUANTILE
                    ),
                ],
            ),
            (
                "Throughput and errors",
                [
                    timeseries_panel(throughput.tokens_per_second(), min_value=0),
                    timeseries_panel(throughput.requests_by_status(), min_value=0, stacked=True),
                    timeseries_panel(throughput.failed_requests(), width=8, min_value=0),
                    timeseries_panel(throughput.requests_running(), width=8, min_value=0),
                    timeseries_panel(throughput.oldest_running_request(), width=8, min_value=0),
                    timeseries_panel(throughput.finish_reasons(), min_value=0, stacked=True),
                    timeseries_panel(
                        throughput.speculative_acceptance(),
                        min_value=0,
                        max_value=1,
                        no_value=throughput.NO_SPECULATION,
                    ),
                ],
            ),
            (
                "Prefill and decode",
                [
                    timeseries_panel(prefill_decode.prefill_vs_decode(), stacked=True),
                    stat_panel(prefill_decode.decode_share()),
                    stat_panel(prefill_decode.batch_size()),
                    timeseries_panel(prefill_decode.queue_vs_prefill(), stacked=True),
                    timeseries_panel(prefill_decode.forward_time_by_phase()),
                    timeseries_panel(prefill_decode.step_tokens(), min_value=0),
                    timeseries_panel(prefill_decode.step_tokens_rate(), min_value=0, stacked=True),
                ],
            ),
            (
                "KV cache and memory",
                [
                    timeseries_panel(memory.kv_cache_bytes(), width=8, min_value=0),
                    timeseries_panel(memory.kv_cache_headroom(), width=8, min_value=0),
                    timeseries_panel(memory.kv_cache_blocks_used(), width=8, min_value=0),
                    timeseries_panel(memory.kv_cache_preemptions(), min_value=0),
                    timeseries_panel(memory.allocator_memory(), min_value=0),
                ],
            ),
            (
                "Device efficiency",
                [
                    timeseries_panel(efficiency.busy_ratio(), width=8, min_value=0),
                    timeseries_panel(efficiency.decode_bandwidth(), width=8, min_value=0),
                    timeseries_panel(efficiency.prefill_flops(), width=8, min_value=0),
                    timeseries_panel(gpu_clocks.models_gpu_clocks(), width=24, min_value=0),
                ],
            ),
        ],
    )


def gpu_hardware() -> models.Dashboard:
    return _dashboard(
        "inferwatch-gpu",
        "inferwatch / GPU hardware",
        "NVML view of every GPU: load, how busy the SMs really are (GPM), memory, power, temperature, "
        "clocks and why they are low, faults.",
        [
            (
                "Load and memory",
                [
                    timeseries_panel(gpu_load.gpu_utilization(), width=8, min_value=0),
                    timeseries_panel(gpu_load.memory_bandwidth_utilization(), width=8, min_value=0),
                    timeseries_panel(gpu_load.device_memory(), width=8, min_value=0),
                ],
            ),
            (
                "Are the SMs really busy? (GPM)",
                [
                    timeseries_panel(gpu_load.sm_activity(), width=8, min_value=0),
                    timeseries_panel(gpu_load.tensor_activity(), width=8, min_value=0),
                    timeseries_panel(gpu_load.dram_activity(), width=8, min_value=0),
                    timeseries_panel(gpu_load.process_sm_utilization(), width=24, min_value=0),
                ],
            ),
            (
                "Power, temperature and clocks",
                [
                    timeseries_panel(gpu_clocks.power(), width=8, min_value=0),
                    timeseries_panel(gpu_clocks.temperature(), width=8),
                    timeseries_panel(gpu_clocks.clocks(), width=8, min_value=0),
                    state_timeline_panel(
                        gpu_clocks.clocks_event_reasons(), gpu_clocks.CLOCKS_EVENT_STATES, width=24, height=10
                    ),
                    timeseries_panel(gpu_clocks.throttle_duty_cycle(), min_value=0),
                    timeseries_panel(gpu_clocks.pstate()),
                ],
            ),
            (
                "Faults and links",
                [
                    timeseries_panel(gpu_faults.xid_errors(), width=8, min_value=0),
                    timeseries_panel(gpu_faults.ecc_errors(), width=8, min_value=0),
                    timeseries_panel(gpu_faults.remapped_rows(), width=8, min_value=0),
                    timeseries_panel(gpu_faults.gpu_up(), width=8),
                    timeseries_panel(gpu_faults.pcie_link(), width=8),
                    timeseries_panel(gpu_faults.pcie_traffic(), width=8, min_value=0),
                    timeseries_panel(gpu_faults.process_gpu_memory(), width=24, min_value=0),
                ],
            ),
        ],
    )


def diagnosis() -> models.Dashboard:
    return _dashboard(
        "inferwatch-diagnosis",
        "inferwatch / Diagnosis",
        "The bottleneck matrix side by side: latency next to clocks, memory next to OOMs, busy ratio "
        "next to host CPU and SM activity, and the health of the monitoring itself.",
        [
            (
                "Is latency following the clocks?",
                [
                    timeseries_panel(latency.inter_token_latency()),
                    timeseries_panel(latency.latency_fluctuation(), min_value=0),
                    timeseries_panel(gpu_clocks.models_gpu_clocks(), width=24, min_value=0),
                    timeseries_panel(gpu_clocks.sm_clock_ratio(), min_value=0),
                    timeseries_panel(gpu_clocks.throttle_duty_cycle(), min_value=0),
                    state_timeline_panel(
                        gpu_clocks.clocks_event_reasons(), gpu_clocks.CLOCKS_EVENT_STATES, width=24
                    ),
                ],
            ),
            (
                "Is memory running out?",
                [
                    timeseries_panel(memory.kv_cache_headroom(), width=8, min_value=0),
                    timeseries_panel(gpu_load.device_memory(), width=8, min_value=0),
                    timeseries_panel(memory.allocator_retries_and_ooms(), width=8, min_value=0),
                    timeseries_panel(memory.kv_cache_blocks_used(), min_value=0),
                    timeseries_panel(memory.kv_cache_preemptions(), min_value=0),
                    timeseries_panel(memory.allocator_memory(), width=24, min_value=0),
                ],
            ),
            (
                "Is the host the bottleneck?",
                [
                    timeseries_panel(efficiency.busy_ratio_vs_nvml(), width=8, min_value=0),
                    timeseries_panel(efficiency.serving_process_cpu(), width=8, min_value=0),
                    timeseries_panel(throughput.requests_running(), width=8, min_value=0),
                    timeseries_panel(gpu_load.sm_activity(), width=12, min_value=0),
                    timeseries_panel(gpu_load.tensor_activity(), width=12, min_value=0),
                ],
            ),
            (
                "Is the monitoring healthy?",
                [
                    timeseries_panel(monitoring.targets_up(), width=8),
                    timeseries_panel(monitoring.collection_age(), width=8, min_value=0),
                    timeseries_panel(monitoring.monitor_errors(), width=8, min_value=0),
                ],
            ),
        ],
    )


# File name -> builder: what is committed in dashboards/ and what `inferwatch dashboards export` writes.
DASHBOARDS: dict[str, Callable[[], models.Dashboard]] = {
    "inferwatch-overview.json": overview,
    "inferwatch-gpu.json": gpu_hardware,
    "inferwatch-diagnosis.json": diagnosis,
}
