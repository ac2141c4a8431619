"""Latency: fluctuation of the inter-token latency, SLO budget burn of TTFT and inter-token latency,
queue time, request errors (``llm_*`` from the serving processes)."""

from __future__ import annotations

from inferwatch.common import names, promql
from inferwatch.common.promql import PER_MODEL, Selector, ne, num, regex

from .base import (
    MODEL,
    VALUE_DURATION,
    VALUE_PERCENT,
    AlertGroup,
    AlertRule,
    Params,
    label,
    per_model_ratio,
)
from .recording import mean_record, slo_error_record

GROUP = AlertGroup("inferwatch-latency")


@GROUP.alert("InferwatchLatencyFluctuation")
def _latency_fluctuation(p: Params) -> list[AlertRule]:
    mean = Selector(mean_record(names.LLM_INTER_TOKEN_LATENCY_SECONDS, p["mean_window"]))
    window = p["window"]
    tokens = p.serving(f"{names.LLM_INTER_TOKEN_LATENCY_SECONDS}_count")
    expr = (
        promql.coefficient_of_variation(mean, window)
        .gt(p["coefficient_of_variation_above"])
        .and_(promql.sum_rate(tokens, PER_MODEL, window).gt(p["min_tokens_per_second"]), on=PER_MODEL)
    )
    return [
        p.rule(
            expr,
            f"Inter-token latency of {MODEL} fluctuates by {VALUE_PERCENT}.",
            f"The mean inter-token latency of {MODEL} per {p['mean_window']} varied with a coefficient of "
            f"variation of {VALUE_PERCENT} over the last {window} (threshold "
            f"{num(p['coefficient_of_variation_above'] * 100)}%), for more than {p['for']}. The same "
            "workload should run at a steady speed: look for throttled clocks, other processes on the "
            "GPU or CPU, and a CPU-bound input pipeline.",
        )
    ]


def _budget_burn(p: Params, metric: str, what: str) -> list[AlertRule]:
    budget = 1 - p["objective_ratio"]
    rules = []
    for speed in ("fast", "slow"):
        settings = p[speed]
        long_window, short_window = settings["long_window"], settings["short_window"]
        threshold = settings["burn_rate"] * budget
        long_ratio = Selector(slo_error_record(metric, long_window))
        short_ratio = Selector(slo_error_record(metric, short_window))
        expr = long_ratio.gt(threshold).and_(short_ratio.gt(threshold))
        rules.append(
            p.rule(
                expr,
                f"{what} of model {label('model')} ({label('job')}) burns its error budget "
                f"{num(settings['burn_rate'])} times too fast.",
                f"{VALUE_PERCENT} of {what.lower()}s of model {label('model')} took longer than "
                f"{num(p['target_seconds'])}s over the last {long_window} (and over the last "
                f"{short_window}); the objective allows {num(budget * 100)}%. At this rate the error "
                "budget of the SLO is spent early.",
                values=settings,
                labels={"long_window": long_window, "short_window": short_window},
            )
        )
    return rules


@GROUP.alert("InferwatchTimeToFirstTokenBudgetBurn")
def _ttft_budget_burn(p: Params) -> list[AlertRule]:
    return _budget_burn(p, names.LLM_TIME_TO_FIRST_TOKEN_SECONDS, "Time to first token")


@GROUP.alert("InferwatchInterTokenLatencyBudgetBurn")
def _itl_budget_burn(p: Params) -> list[AlertRule]:
    return _budget_burn(p, names.LLM_INTER_TOKEN_LATENCY_SECONDS, "Inter-token latency")


@GROUP.alert("InferwatchQueueTimeHigh")
def _queue_time_high(p: Params) -> list[AlertRule]:
    queue = p.serving(names.LLM_REQUEST_QUEUE_SECONDS)
    window, quantile = p["window"], p["quantile_ratio"]
    percentile = f"p{num(quantile * 100)}"
    requests = promql.sum_rate(queue.suffixed("_count"), PER_MODEL, window)
    expr = (
        promql.histogram_quantile(quantile, queue, PER_MODEL, window)
        .gt(p["seconds_above"])
        .and_(requests.gt(p["min_requests_per_second"]), on=PER_MODEL)
    )
    return [
        p.rule(
            expr,
            f"Requests to {MODEL} wait {VALUE_DURATION} ({percentile}) before their first forward.",
            f"The {percentile} of the time requests to {MODEL} spent between their arrival at the server "
            f"and their first forward on the device was {VALUE_DURATION} over the last {window} "
            f"(threshold {num(p['seconds_above'])}s), for more than {p['for']}. That time is part of "
            "every request's time to first token: the model has more requests than it serves at once.",
        )
    ]


@GROUP.alert("InferwatchRequestErrors")
def _request_errors(p: Params) -> list[AlertRule]:
    # A request the client abandoned (status="cancelled": a chat UI's stop button) is no failure, and a
    # client's mistake (status="rejected": a 4xx, zero tokens asked for) is not the service's: an
    # availability ratio leaves it out of both sides. A 5xx before any model ran is a failure.
    failed = p.serving(names.LLM_REQUESTS_TOTAL, regex("status", "error|oom|server_error"))
    everything = p.serving(names.LLM_REQUESTS_TOTAL, ne("status", "rejected"))
    window = p["window"]
    expr = per_model_ratio(failed, everything, window).gt(p["error_ratio_above"])
    return [
        p.rule(
            expr,
            f"{VALUE_PERCENT} of requests to {MODEL} fail.",
            f"{VALUE_PERCENT} of the requests to {MODEL} ended in an error, out-of-memory or a server error "
            "before any model ran over the "
            f"last {window} (threshold {num(p['error_ratio_above'] * 100)}%), for more than {p['for']}.",
        )
    ]
