"""The PromQL builder: matchers, precedence, windows given at rendering, and the pretty printer."""

from __future__ import annotations

import pytest

from inferwatch.common import promql
from inferwatch.common.promql import Matcher, Selector, eq, parse_matchers, regex

TOKENS = Selector("llm_generation_tokens_total", (eq("job", "llm"),))


def test_matchers_are_values_escaped_when_rendered() -> None:
    selector = Selector("x_bucket", (regex("le", "1\\.0|1"), Matcher("msg", 'say "hi"', "!=")))
    assert selector.render() == 'x_bucket{le=~"1\\\\.0|1", msg!="say \\"hi\\""}'
    assert Selector("up").render() == "up"
    assert (
        Selector(TOKENS.metric, (*TOKENS.matchers, regex("model", "$model"))).render()
        == 'llm_generation_tokens_total{job="llm", model=~"$model"}'
    )


def test_configured_selectors_parse_into_matchers_and_render_back() -> None:
    text = 'job="llm-serving", env=~"prod|canary", team!="x\\"y",'
    parsed = parse_matchers(text)
    assert parsed == (
        Matcher("job", "llm-serving"),
        Matcher("env", "prod|canary", "=~"),
        Matcher("team", 'x"y', "!="),
    )
    assert ", ".join(m.render() for m in parsed) == text.rstrip(",")
    assert parse_matchers("") == ()
    with pytest.raises(ValueError, match="not PromQL label matchers"):
        parse_matchers("job=llm")


def test_ranges_take_the_window_given_at_rendering_unless_they_name_their_own() -> None:
    rate = promql.sum_rate(TOKENS, ("model",))
    assert rate.render("$__rate_interval") == (
        'sum by (model) (rate(llm_generation_tokens_total{job="llm"}[$__rate_interval]))'
    )
    assert promql.rate(TOKENS, "5m", offset="1h").render("1m") == (
        'rate(llm_generation_tokens_total{job="llm"}[5m] offset 1h)'
    )
    with pytest.raises(ValueError, match="has no window"):
        rate.render()


def test_parentheses_follow_promql_precedence() -> None:
    a, b, c = Selector("a"), Selector("b"), Selector("c")
    assert (a / (b + c)).render() == "a / (b + c)"
    assert (a / b + c).render() == "a / b + c"
    assert (a - (b - c)).render() == "a - (b - c)"
    assert (1 - a / b).render() == "1 - a / b"
    assert (a.gt(1).and_(b.lt(2), on=("job",))).render() == "a > 1 and on (job) b < 2"
    assert (a.or_(b)).gt(0).render() == "(a or b) > 0"
    assert (0 * a.eq(1)).render() == "0 * (a == 1)"
    matching = promql.Matching(("uuid",), group_left=("gpu",))
    assert a.times(b, matching).render() == "a * on (uuid) group_left (gpu) b"


def test_the_shapes_every_consumer_shares() -> None:
    ttft = Selector("ttft_seconds", (eq("job", "llm"),))
    by = ("job", "instance", "model")
    assert promql.histogram_quantile(0.99, ttft, by).render("5m") == (
        "histogram_quantile(0.99, sum by (job, instance, model, le) "
        '(rate(ttft_seconds_bucket{job="llm"}[5m])))'
    )
    assert promql.histogram_mean(ttft, ("model",)).render("5m") == (
        'sum by (model) (rate(ttft_seconds_sum{job="llm"}[5m]))'
        ' / sum by (model) (rate(ttft_seconds_count{job="llm"}[5m]))'
    )
    mean = Selector("mean")
    assert promql.coefficient_of_variation(mean, "15m").render() == (
        "stddev_over_time(mean[15m]) / avg_over_time(mean[15m])"
    )
    assert promql.coefficient_of_variation(mean, "15m", "$__rate_interval").render() == (
        "stddev_over_time(mean[15m:$__rate_interval]) / avg_over_time(mean[15m:$__rate_interval])"
    )


def test_pretty_breaks_only_what_does_not_fit() -> None:
    short = Selector("a").gt(1)
    assert short.pretty() == short.render() == "a > 1"
    long_name = "x" * 60
    ratio = promql.sum_rate(Selector(long_name), ("model",), "5m") / promql.sum_rate(
        Selector(long_name + "_count"), ("model",), "5m"
    )
    assert ratio.gt(0.5).pretty() == (
        "(\n"
        f"  sum by (model) (rate({long_name}[5m]))\n"
        f"  / sum by (model) (rate({long_name}_count[5m]))\n"
        ")\n"
        "> 0.5"
    )
