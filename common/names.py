"""The metric names alerts, dashboards and the monitor read: one vocabulary, written once.

The metrics themselves are defined where they are produced: ``llm_*`` in
``inferwatch.instrumentation.catalogue`` and the exporter's families next to the collector that fills
each. Those are not what the readers import: the exporter's collector modules pull in psutil and the
NVML binding, which the ``monitor``, ``alerts`` and ``dashboards`` extras do not install; ``up`` and
``process_*`` belong to Prometheus and prometheus_client and are in neither catalogue; and this module
must stay importable by every package (see :mod:`inferwatch.common`). So the names are plain strings
here, each constant the metric's name in capitals, and ``tests/unit/common/test_names.py`` checks every
one against the instrumentation's catalogue and docs/metrics.md's exporter section (which another test
keeps equal to what the exporter exposes), and that alerts, dashboards and the monitor spell no metric
name themselves.
"""

# --- instrumented serving processes (inferwatch.instrumentation.catalogue) ----------------------------
LLM_TIME_TO_FIRST_TOKEN_SECONDS = "llm_time_to_first_token_seconds"
LLM_INTER_TOKEN_LATENCY_SECONDS = "llm_inter_token_latency_seconds"
LLM_REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS = "llm_request_time_per_output_token_seconds"
LLM_REQUEST_MAX_INTER_TOKEN_LATENCY_SECONDS = "llm_request_max_inter_token_latency_seconds"
LLM_E2E_REQUEST_LATENCY_SECONDS = "llm_e2e_request_latency_seconds"
LLM_REQUEST_PREFILL_SECONDS = "llm_request_prefill_seconds"
LLM_REQUEST_DECODE_SECONDS = "llm_request_decode_seconds"
LLM_REQUEST_QUEUE_SECONDS = "llm_request_queue_seconds"
LLM_FORWARD_SECONDS = "llm_forward_seconds"
LLM_REQUEST_PROMPT_TOKENS = "llm_request_prompt_tokens"
LLM_REQUEST_GENERATION_TOKENS = "llm_request_generation_tokens"
LLM_BATCH_SIZE = "llm_batch_size"
LLM_REQUESTS_TOTAL = "llm_requests_total"
LLM_PROMPT_TOKENS_TOTAL = "llm_prompt_tokens_total"
LLM_GENERATION_TOKENS_TOTAL = "llm_generation_tokens_total"
LLM_OOM_EVENTS_TOTAL = "llm_oom_events_total"
LLM_TORCH_ALLOC_RETRIES_TOTAL = "llm_torch_alloc_retries_total"
LLM_INSTRUMENTATION_ERRORS_TOTAL = "llm_instrumentation_errors_total"
LLM_REQUESTS_RUNNING = "llm_requests_running"
LLM_REQUESTS_WAITING = "llm_requests_waiting"
LLM_KV_CACHE_BYTES = "llm_kv_cache_bytes"
LLM_KV_CACHE_HEADROOM_TOKENS = "llm_kv_cache_headroom_tokens"
LLM_TORCH_MEMORY_BYTES = "llm_torch_memory_bytes"
LLM_GPU_BUSY_RATIO = "llm_gpu_busy_ratio"
LLM_DECODE_BANDWIDTH_UTILIZATION_RATIO = "llm_decode_bandwidth_utilization_ratio"
LLM_PREFILL_FLOPS_UTILIZATION_RATIO = "llm_prefill_flops_utilization_ratio"
LLM_MODEL_INFO = "llm_model_info"
LLM_LAST_STEP_TIMESTAMP_SECONDS = "llm_last_step_timestamp_seconds"

# --- inferwatch-exporter (docs/metrics.md, "Exporter") ------------------------------------------------
GPU_INFO = "gpu_info"
GPU_UP = "gpu_up"
GPU_UTILIZATION_RATIO = "gpu_utilization_ratio"
GPU_MEMORY_BANDWIDTH_UTILIZATION_RATIO = "gpu_memory_bandwidth_utilization_ratio"
GPU_SM_ACTIVE_RATIO = "gpu_sm_active_ratio"
GPU_SM_OCCUPANCY_RATIO = "gpu_sm_occupancy_ratio"
GPU_TENSOR_ACTIVE_RATIO = "gpu_tensor_active_ratio"
GPU_DRAM_ACTIVE_RATIO = "gpu_dram_active_ratio"
GPU_MEMORY_TOTAL_BYTES = "gpu_memory_total_bytes"
GPU_MEMORY_USED_BYTES = "gpu_memory_used_bytes"
GPU_MEMORY_FREE_BYTES = "gpu_memory_free_bytes"
GPU_POWER_WATTS = "gpu_power_watts"
GPU_POWER_LIMIT_WATTS = "gpu_power_limit_watts"
GPU_TEMPERATURE_CELSIUS = "gpu_temperature_celsius"
GPU_TEMPERATURE_THRESHOLD_CELSIUS = "gpu_temperature_threshold_celsius"
GPU_CLOCK_HZ = "gpu_clock_hz"
GPU_CLOCK_MAX_HZ = "gpu_clock_max_hz"
GPU_PSTATE = "gpu_pstate"
GPU_CLOCKS_EVENT_ACTIVE = "gpu_clocks_event_active"
GPU_CLOCKS_EVENT_SECONDS_TOTAL = "gpu_clocks_event_seconds_total"
GPU_PCIE_LINK_GEN = "gpu_pcie_link_gen"
GPU_PCIE_LINK_WIDTH = "gpu_pcie_link_width"
GPU_PCIE_LINK_MAX_GEN = "gpu_pcie_link_max_gen"
GPU_PCIE_LINK_MAX_WIDTH = "gpu_pcie_link_max_width"
GPU_PCIE_REPLAYS_TOTAL = "gpu_pcie_replays_total"
GPU_PCIE_TX_BYTES_PER_SECOND = "gpu_pcie_tx_bytes_per_second"
GPU_PCIE_RX_BYTES_PER_SECOND = "gpu_pcie_rx_bytes_per_second"
GPU_ECC_ERRORS_TOTAL = "gpu_ecc_errors_total"
GPU_REMAPPED_ROWS = "gpu_remapped_rows"
GPU_REMAPPED_ROWS_PENDING = "gpu_remapped_rows_pending"
GPU_REMAPPED_ROWS_FAILED = "gpu_remapped_rows_failed"
GPU_PROCESS_MEMORY_BYTES = "gpu_process_memory_bytes"
GPU_PROCESS_SM_UTILIZATION_RATIO = "gpu_process_sm_utilization_ratio"
GPU_XID_ERRORS_TOTAL = "gpu_xid_errors_total"
HOST_CPU_SECONDS_TOTAL = "host_cpu_seconds_total"
HOST_CPUS = "host_cpus"
HOST_MEMORY_TOTAL_BYTES = "host_memory_total_bytes"
HOST_MEMORY_AVAILABLE_BYTES = "host_memory_available_bytes"
INFERWATCH_PROCESS_CPU_SECONDS_TOTAL = "inferwatch_process_cpu_seconds_total"
INFERWATCH_PROCESS_RESIDENT_MEMORY_BYTES = "inferwatch_process_resident_memory_bytes"
INFERWATCH_NVML_UP = "inferwatch_nvml_up"
INFERWATCH_EXPORTER_LAST_COLLECT_TIMESTAMP_SECONDS = "inferwatch_exporter_last_collect_timestamp_seconds"
INFERWATCH_EXPORTER_COLLECT_DURATION_SECONDS = "inferwatch_exporter_collect_duration_seconds"
INFERWATCH_EXPORTER_COLLECTION_OVERRUNS_TOTAL = "inferwatch_exporter_collection_overruns_total"
INFERWATCH_EXPORTER_NVML_ERRORS_TOTAL = "inferwatch_exporter_nvml_errors_total"

# --- Prometheus's own series, and prometheus_client's process collector in a serving process ---------
UP = "up"
PROCESS_RESIDENT_MEMORY_BYTES = "process_resident_memory_bytes"
