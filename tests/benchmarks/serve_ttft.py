"""TTFT as the client gets it under ``transformers serve --continuous-batching`` (issue 49, item 2).

One ``inferwatch run -- transformers serve --continuous-batching`` on the small random model the serving
tests use; guidellm (the third-party load generator, ``.venv-guidellm``) sends ``--requests`` streaming
chats at each concurrency of ``--streams``, one run after the other. For each run, what guidellm measured
beside what inferwatch exported for the same requests (means over the run, from the histograms' sums):

* ``ttft``: inferwatch's ``llm_time_to_first_token_seconds``, which behind the HTTP edge ends at the first
  content sent (the change this benchmark was written for);
* ``sampled``: arrival to the first token sampled (``llm_request_queue_seconds`` +
  ``llm_request_prefill_seconds``: the queue ends where the prefill starts), what TTFT read before;
* ``first_content``, ``e2e``, and guidellm's TTFT and E2E.

The check: inferwatch's TTFT within 10 % or 10 ms of guidellm's at every concurrency. Run from the
repository root on the development machine (about two minutes)::

    .venv/bin/python tests/benchmarks/serve_ttft.py --json serve-ttft.json

Exit status 0 when the check holds at every concurrency, 1 when it does not.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from tests.support.guidellm import run_guidellm  # noqa: E402
from tests.support.servemodel import write_serve_model  # noqa: E402
from tests.support.transformers_serve import delta, histogram_mean, metrics_after, serve  # noqa: E402

PROMPT_TOKENS = 32
MAX_TOKENS = 256
RELATIVE, ABSOLUTE = 0.10, 0.010


def one_run(server: Any, workdir: Path, requests: int, streams: int) -> dict[str, Any]:
    before = server.metrics()
    sizes = {"prompt_tokens": PROMPT_TOKENS, "max_tokens": MAX_TOKENS}
    report = run_guidellm(server, workdir, requests=requests, streams=streams, **sizes)
    after = metrics_after(server, before, "llm_e2e_request_latency_seconds_count", report.sent)

    def mean(name: str) -> float:
        return histogram_mean(before, after, name)

    ttft = mean("llm_time_to_first_token_seconds")
    client_ttft = report.mean_ttft
    bound = max(RELATIVE * client_ttft, ABSOLUTE)
    return {
        "streams": streams,
        "requests": report.sent,
        "requests_counted": delta(before, after, "llm_requests_total", status="ok"),
        "guidellm_ttft_s": client_ttft,
        # Per request, to tell one slow request (a client's first, a busy core) from a shift of all.
        "guidellm_ttft_per_request_s": [r.ttft for r in report.successful],
        "ttft_s": ttft,
        "sampled_s": mean("llm_request_queue_seconds") + mean("llm_request_prefill_seconds"),
        "first_content_s": mean("llm_response_time_to_first_content_seconds"),
        "guidellm_e2e_s": report.mean_e2e,
        "e2e_s": mean("llm_e2e_request_latency_seconds"),
        "ttft_within_bound": abs(ttft - client_ttft) <= bound,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="serve-ttft-") as scratch:
        workdir = Path(scratch)
        model_dir = write_serve_model(workdir / "model")
        options = ("--continuous-batching", "--cb-num-blocks=512", "--cb-max-batch-tokens=512")
        started = serve(
            workdir, model_dir, force_model=True, model_timeout=600, name="serve-cb", options=options
        )
        with started as server:
            for streams in args.streams:
                row = one_run(server, workdir / f"guidellm-{streams}", args.requests, streams)
                rows.append(row)
                ms = {key: f"{value * 1e3:.1f} ms" for key, value in row.items() if isinstance(value, float)}
                print(
                    f"c={streams}: guidellm TTFT {ms['guidellm_ttft_s']} | inferwatch TTFT {ms['ttft_s']} "
                    f"(first token sampled {ms['sampled_s']}, first content {ms['first_content_s']}) | E2E "
                    f"guidellm {ms['guidellm_e2e_s']}, inferwatch {ms['e2e_s']} | "
                    f"within bound: {row['ttft_within_bound']}",
                    flush=True,
                )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0 if all(row["ttft_within_bound"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
