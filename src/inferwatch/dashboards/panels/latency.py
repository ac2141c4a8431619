"""Latency: time to first token and the queue time inside it, the first content the server sent against
it, inter-token and end-to-end latency, time per output token, and the fluctuation the latency alert
watches."""

from __future__ import annotations

from inferwatch.alerts.rules.recording import SERVED, mean_record
from inferwatch.common import names, promql
from inferwatch.common.promql import Matcher

from ..grafana import RATE, PanelSpec, Query, above, normal
from .queries import (
    MODEL_LEGEND,
    QUANTILES,
    alert_settings,
    mean,
    percentile,
    query,
    recorded_quantile,
    recorded_quantiles,
    serving,
)


def _latency(
    metric: str, title: str, description: str, thresholds: list, with_mean: bool = False, *matchers: Matcher
) -> PanelSpec:
    queries = [percentile(metric, q, *matchers) for q in QUANTILES]
    if with_mean:
        queries.append(mean(metric))
    return PanelSpec(title, description, "s", thresholds, queries)


def time_to_first_token() -> PanelSpec:
    target = alert_settings("InferwatchTimeToFirstTokenBudgetBurn")["target_seconds"]
    return _latency(
        names.LLM_TIME_TO_FIRST_TOKEN_SECONDS,
        "Time to first token",
        f"From the request's arrival at the server (where the server reports it; else its entry into "
        f"generate) until the first token reached the client: behind the HTTP edge, the first response "
        f"chunk with content sent; elsewhere its sampling on the device. The red line is the SLO target "
        f"({target} s) of InferwatchTimeToFirstTokenBudgetBurn.",
        above(target),
    )


def first_token_against_first_content() -> PanelSpec:
    sent = names.LLM_RESPONSE_TIME_TO_FIRST_CONTENT_SECONDS
    queue, prefill = names.LLM_REQUEST_QUEUE_SECONDS, names.LLM_REQUEST_PREFILL_SECONDS
    sampled = promql.Binary(
        "+",
        promql.histogram_mean(serving(queue), promql.PER_MODEL),
        promql.histogram_mean(serving(prefill), promql.PER_MODEL),
    )
    return PanelSpec(
        "First token sampled vs first content sent",
        "Means: when the device had the first token (queue time plus prefill, from the arrival) against "
        "when the server sent the first body chunk with content (behind the HTTP edge, the time to first "
        "token as the client gets it). The gap is the serving stack's: a streamer that holds text back, "
        "queues and threads between the model and the HTTP response (an engine process), event framing. "
        "Empty without the ASGI/WSGI middleware (inferwatch run adds it to transformers serve).",
        "s",
        normal(),
        [
            query(sampled, f"sampled mean {MODEL_LEGEND}"),
            mean(sent, what="sent mean"),
        ],
    )


def queue_time() -> PanelSpec:
    settings = alert_settings("InferwatchQueueTimeHigh")
    metric = names.LLM_REQUEST_QUEUE_SECONDS
    return PanelSpec(
        "Queue time",
        "Per request with a known arrival: from its arrival at the server until its first forward on "
        "the device (queue, lock, tokenization, generate's set-up), the part of time to first token "
        f"spent waiting. The red line is the threshold ({settings['seconds_above']} s) of "
        f"InferwatchQueueTimeHigh on the p{settings['quantile_ratio'] * 100:g}.",
        "s",
        above(settings["seconds_above"]),
        [percentile(metric, 0.5), percentile(metric, 0.99), mean(metric)],
    )


def inter_token_latency() -> PanelSpec:
    target = alert_settings("InferwatchInterTokenLatencyBudgetBurn")["target_seconds"]
    return _latency(
        names.LLM_INTER_TOKEN_LATENCY_SECONDS,
        "Inter-token latency",
        f"Time between consecutive tokens of a request, and its mean. The red line is the SLO target "
        f"({target} s) of InferwatchInterTokenLatencyBudgetBurn.",
        above(target),
        with_mean=True,
    )


def end_to_end_latency() -> PanelSpec:
    return _latency(
        names.LLM_E2E_REQUEST_LATENCY_SECONDS,
        "End-to-end latency",
        "Host time from the request's arrival (else its entry into generate) to generate's return, per "
        'served request (outcome="ok"; a cancelled request\'s ends when its client left). It grows with the '
        "number of generated tokens; compare it with the per-token panels before calling it slow.",
        normal(),
        False,
        SERVED,
    )


def per_request_token_time() -> PanelSpec:
    return PanelSpec(
        "Time per output token and worst stall",
        "Per request: the mean time per output token after the first, and the longest single gap between "
        "two tokens (p99 over requests). A worst stall far above the mean is a hiccup, not a slow model.",
        "s",
        above(alert_settings("InferwatchInterTokenLatencyBudgetBurn")["target_seconds"]),
        [
            percentile(names.LLM_REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS, 0.5),
            percentile(names.LLM_REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS, 0.99),
            Query(
                percentile(names.LLM_REQUEST_MAX_INTER_TOKEN_LATENCY_SECONDS, 0.99).expr,
                f"worst stall p99 {MODEL_LEGEND}",
            ),
        ],
    )


def latency_fluctuation() -> PanelSpec:
    settings = alert_settings("InferwatchLatencyFluctuation")
    window, mean_window = settings["window"], settings["mean_window"]
    # The alert's own input: the recording rule of the mean per mean_window, sampled at the panel's step.
    means = serving(mean_record(names.LLM_INTER_TOKEN_LATENCY_SECONDS, mean_window))
    return PanelSpec(
        "Inter-token latency fluctuation",
        f"Coefficient of variation (standard deviation / mean) over {window} of the mean inter-token "
        f"latency per {mean_window}: what InferwatchLatencyFluctuation watches, read from the same recording "
        f"rule. The same workload should stay under {settings['coefficient_of_variation_above']:.0%}.",
        "percentunit",
        above(settings["coefficient_of_variation_above"]),
        [query(promql.coefficient_of_variation(means, window, RATE), MODEL_LEGEND)],
    )


NO_RECORDED_QUANTILE = "No recorded percentile (recording.quantiles is empty, or no rules are loaded)"


def per_model_over_replicas() -> PanelSpec:
    """The highest recorded quantile of time to first token, inter-token and end-to-end latency per model,
    over every replica: a fleet's view, one line per model and histogram."""
    recorded = recorded_quantiles()
    histograms = (
        (names.LLM_TIME_TO_FIRST_TOKEN_SECONDS, "TTFT"),
        (names.LLM_INTER_TOKEN_LATENCY_SECONDS, "inter-token"),
        (names.LLM_E2E_REQUEST_LATENCY_SECONDS, "end-to-end"),
    )
    queries = []
    if recorded:
        top = max(recorded)
        queries = [
            recorded_quantile(metric, top, f"{what} p{top * 100:g} {{{{model}}}}")
            for metric, what in histograms
        ]
    return PanelSpec(
        "Latency per model, every replica",
        "Per model over all its replicas (the instance selection does not apply): the recording rules' "
        "percentiles, from the bucket rates of every replica added first (never replicas' percentiles "
        "averaged), over the recording window (5m by default). The panels above are per replica; this one "
        "is what a fleet's service level looks like, and costs one recorded series per line to draw.",
        "s",
        normal(),
        queries,
    )
