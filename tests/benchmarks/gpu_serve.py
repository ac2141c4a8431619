"""``transformers serve`` under ``inferwatch run`` on a GPU, driven by the official ``openai`` client: what
the clients measured next to what inferwatch reported, in the same run.

For each concurrency level, ``--requests-per-client`` streaming chat completions per client run at once.
Each client measures its time to the first content chunk (TTFT), the mean gap between content chunks
(ITL) and its total time (E2E). inferwatch's figures are the change of its histograms over the level:
TTFT, queue time (arrival to the first forward), inter-token latency and E2E.

    python tests/benchmarks/gpu_serve.py [--concurrency 1 4 16] [--json out.json]

Needs transformers' ``serving`` extra and ``openai`` (carried as wheels on the GPU machine).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench_common import environment, print_table, write_json
from prometheus_client.parser import text_string_to_metric_families

from tests.support import free_port
from tests.support.servemodel import write_serve_model

#: A ~1.1B Llama (TinyLlama's shape) with the test tokenizer's small vocabulary; "tiny" checks the script
#: itself on a CPU.
MODEL_SHAPES = {
    "llama-1b": {"hidden_size": 2048, "intermediate_size": 5632, "layers": 22, "heads": 32, "kv_heads": 4},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "layers": 2, "heads": 4, "kv_heads": 2},
}
PROMPT = "Describe how a GPU runs a transformer, step by step, in plain words. " * 4


def scrape(url: str) -> dict[str, float]:
    """Every sample of the endpoint, summed over labels but ``status``."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + (f"{{{sample.labels['status']}}}" if "status" in sample.labels else "")
            values[key] = values.get(key, 0.0) + sample.value
    return values


def mean_delta(before: dict, after: dict, name: str) -> float:
    count = after.get(f"{name}_count", 0) - before.get(f"{name}_count", 0)
    return (after.get(f"{name}_sum", 0) - before.get(f"{name}_sum", 0)) / count if count else float("nan")


def one_request(client, model: str, max_tokens: int, out: list[dict]) -> None:
    start = time.perf_counter()
    first = last = None
    gaps: list[float] = []
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens, stream=True
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            now = time.perf_counter()
            if first is None:
                first = now
            else:
                gaps.append(now - last)
            last = now
    end = time.perf_counter()
    out.append({"ttft": first - start, "itl": statistics.fmean(gaps), "e2e": end - start})


def run_level(client, model: str, clients: int, per_client: int, max_tokens: int, metrics_url: str) -> dict:
    before = scrape(metrics_url)
    results: list[dict] = []

    def worker() -> None:
        for _ in range(per_client):
            one_request(client, model, max_tokens, results)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(1.0)  # the last observations are made off the hot path
    after = scrape(metrics_url)
    row = {"clients": clients, "requests": len(results)}
    for key in ("ttft", "itl", "e2e"):
        row[f"client_{key}"] = statistics.fmean(r[key] for r in results)
    row["iw_ttft"] = mean_delta(before, after, "llm_time_to_first_token_seconds")
    row["iw_queue"] = mean_delta(before, after, "llm_request_queue_seconds")
    row["iw_itl"] = mean_delta(before, after, "llm_inter_token_latency_seconds")
    row["iw_e2e"] = mean_delta(before, after, "llm_e2e_request_latency_seconds")
    ok = "llm_requests_total{ok}"
    row["iw_ok"] = after.get(ok, 0) - before.get(ok, 0)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--requests-per-client", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model", choices=sorted(MODEL_SHAPES), default="llama-1b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", help="also write the rows and environment to this file")
    args = parser.parse_args()
    shape = MODEL_SHAPES[args.model]
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    from openai import OpenAI

    workdir = Path(tempfile.mkdtemp(prefix="gpu-serve-"))
    model_dir = write_serve_model(workdir / args.model, device=args.device, dtype=dtype, **shape)
    metrics_port, serve_port = free_port(), free_port()
    command = [
        sys.executable, "-c", "import sys; from inferwatch.cli import main; sys.exit(main())",
        "run", "--port", str(metrics_port), "--",
        "transformers", "serve", str(model_dir), "--port", str(serve_port), "--device", args.device,
        "--dtype", dtype,
    ]  # fmt: skip
    log = open(workdir / "serve.log", "w")  # noqa: SIM115 (lives as long as the server)
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{serve_port}/v1", api_key="unused", max_retries=0)
        deadline = time.monotonic() + 300
        while True:
            try:
                one_request(client, str(model_dir), 8, [])
                break
            except Exception:
                if time.monotonic() > deadline or server.poll() is not None:
                    print((workdir / "serve.log").read_text()[-4000:], file=sys.stderr)
                    return 2
                time.sleep(1.0)
        for _ in range(3):  # warm-up
            one_request(client, str(model_dir), args.max_tokens, [])
        rows = [
            run_level(client, str(model_dir), clients, args.requests_per_client, args.max_tokens, metrics_url)
            for clients in args.concurrency
        ]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
    env = environment()
    print(f"# gpu_serve {env}")

    def ms(seconds: float) -> str:
        return f"{seconds * 1e3:.2f}"

    columns = [("clients", "clients", str), ("requests", "requests", str), ("iw_ok", "ok (iw)", str)]
    for key, title in (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "E2E")):
        columns += [(f"client_{key}", f"{title} client ms", ms), (f"iw_{key}", f"{title} inferwatch ms", ms)]
    columns.append(("iw_queue", "queue inferwatch ms", ms))
    print_table(rows, columns)
    write_json(args.json, {"environment": env, "model": shape, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
