"""``inferwatch run``: a real program, unchanged, gets its transformers models instrumented and served."""

from __future__ import annotations

import signal
import socket
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import http_get, parse_samples, sample_value
from tests.support.processes import INFERWATCH, run, spawn
from tests.support.services import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.matrix]

# A serving program as a user writes it, with no inferwatch in it: one model from each construction path
# (from_config, from_pretrained, direct), each moved to the device argument after it is built and
# generating a known number of tokens; then it waits for the test to scrape (a release file, bounded in
# time) and exits with a status of its own.
PROGRAM = """
import sys, tempfile, time
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

config = LlamaConfig(
    vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, bos_token_id=256, eos_token_id=257, pad_token_id=258,
)
release, device = Path(sys.argv[1]), sys.argv[2]
prompt = torch.tensor([[256, 72, 105, 33]], device=device)

def generate(model, new_tokens):
    model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                   min_new_tokens=new_tokens, do_sample=False)

built = AutoModelForCausalLM.from_config(config).to(device)
generate(built, 7)
saved = tempfile.mkdtemp()
built.save_pretrained(saved)
generate(AutoModelForCausalLM.from_pretrained(saved).to(device), 5)
generate(LlamaForCausalLM(config).to(device), 3)
print("generated", flush=True)
deadline = time.monotonic() + 60
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(5)
"""


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_models_of_an_unchanged_program_are_instrumented_and_served(
    tmp_path: Path, port: int, device: str
) -> None:
    program = write(tmp_path / "serve.py", PROGRAM)
    release = tmp_path / "release"
    url = f"http://127.0.0.1:{port}/metrics"
    command = [*INFERWATCH, "run", f"--port={port}", "--model-name=served", "--", sys.executable]
    with spawn([*command, str(program), str(release), device], tmp_path) as process:
        body = wait_until(
            lambda: (
                process.popen.poll() is None
                and "generated" in process.stdout()
                and _body_if(url, "llm_requests_total", 3)
            ),
            timeout=120,
            what=lambda: f"three requests on {url}; stderr:\n{process.stderr()}",
        )
        assert sample_value(body, "llm_requests_total", model="served", status="ok") == 3
        assert sample_value(body, "llm_generation_tokens_total", model="served") == 7 + 5 + 3
        assert sample_value(body, "llm_prompt_tokens_total", model="served") == 3 * 4
        assert sample_value(body, "llm_time_to_first_token_seconds_count", model="served") == 3
        # Instrumented where the models serve: after from_pretrained loaded the weights (never "meta"),
        # after the program moved them.
        devices = {s.labels["device"] for s in parse_samples(body) if s.name == "llm_model_info"}
        assert devices == {"cpu" if device == "cpu" else "cuda:0"}
        release.touch()
        assert process.wait(60) == 5
    assert f"serving metrics on {url}" in process.stderr()


def _body_if(url: str, name: str, at_least: float) -> str | None:
    """The exposition at ``url`` once the sum of ``name`` reached ``at_least``."""
    try:
        status, body = http_get(url, timeout=2)
    except OSError:
        return None
    value = sample_value(body, name) if status == 200 else None
    return body if value is not None and value >= at_least else None


def test_a_failing_instrumentation_never_breaks_the_program(tmp_path: Path) -> None:
    # Fault injection: the program replaces instrument() with one that raises, before it builds a model.
    program = write(
        tmp_path / "serve.py",
        """
        import torch
        import inferwatch.instrumentation
        from transformers import AutoModelForCausalLM, GPT2Config

        def broken_instrument(*args, **kwargs):
            raise RuntimeError("injected instrumentation fault")

        inferwatch.instrumentation.instrument = broken_instrument
        model = AutoModelForCausalLM.from_config(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=99))
        prompt = torch.tensor([[1, 2, 3]])
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4,
                             min_new_tokens=4, do_sample=False, pad_token_id=0)
        print("generated", tuple(out.shape))
        """,
    )
    status, stdout, stderr = run(
        [*INFERWATCH, "run", "--no-server", "--", sys.executable, str(program)], tmp_path
    )
    assert status == 0, stderr
    assert "generated (1, 7)" in stdout
    assert "could not instrument GPT2LMHeadModel" in stderr
    assert "injected instrumentation fault" in stderr


def test_exit_status_and_process_pass_through(tmp_path: Path) -> None:
    # The launcher execs the program: same process id, and the program's own exit status.
    with spawn(
        [
            *INFERWATCH,
            "run",
            "--no-server",
            "--",
            sys.executable,
            "-c",
            "import os; print(os.getpid()); exit(7)",
        ],
        tmp_path,
    ) as process:
        assert process.wait(30) == 7
        assert process.stdout().strip() == str(process.popen.pid)


def test_signals_reach_the_program(tmp_path: Path) -> None:
    script = "import time; print('ready', flush=True); time.sleep(60)"
    with spawn([*INFERWATCH, "run", "--no-server", "--", sys.executable, "-c", script], tmp_path) as process:
        wait_until(lambda: "ready" in process.stdout(), timeout=30, what="the program to start")
        process.popen.send_signal(signal.SIGTERM)
        assert process.wait(10) == -signal.SIGTERM


def test_an_existing_sitecustomize_still_runs(tmp_path: Path, port: int) -> None:
    user_site = tmp_path / "site"
    user_site.mkdir()
    write(user_site / "sitecustomize.py", "import os\nos.environ['USER_SITECUSTOMIZE'] = 'ran'\n")
    check = (
        "import os, sys; "
        "print(os.environ.get('USER_SITECUSTOMIZE'), "
        "any(type(f).__name__ == 'PostImportHook' for f in sys.meta_path))"
    )
    status, stdout, stderr = run(
        [*INFERWATCH, "run", f"--port={port}", "--", sys.executable, "-c", check],
        tmp_path,
        env={"PYTHONPATH": str(user_site)},
    )
    assert (status, stdout.split()) == (0, ["ran", "True"]), stderr


@pytest.mark.parametrize(
    ("arguments", "env", "message"),
    [
        (["--bogus", "--", "true"], {}, "unrecognized arguments: --bogus"),
        ([], {}, "no program given"),
        (["--port=-1", "--", "true"], {}, "--port: port must be an integer in 0..65535, got -1"),
        (["--", "true"], {"INFERWATCH_PORT": "http"}, "INFERWATCH_PORT must be an integer"),
        (["--ttft-buckets=0.1,x", "--", "true"], {}, "--ttft-buckets: INFERWATCH_TTFT_BUCKETS='0.1,x'"),
        (["--", "true"], {"INFERWATCH_ENABLE_NVML": "maybe"}, "INFERWATCH_ENABLE_NVML='maybe'"),
    ],
)
def test_bad_configuration_exits_2_before_running(
    tmp_path: Path, arguments: list[str], env: dict[str, str], message: str
) -> None:
    status, _, stderr = run([*INFERWATCH, "run", *arguments], tmp_path, env=env)
    assert status == 2
    assert message in stderr


@pytest.mark.parametrize("how", ["option", "environment"])
def test_taken_port_exits_2_in_one_line_before_the_program_runs(tmp_path: Path, port: int, how: str) -> None:
    # The program would leave a marker file; a taken port must stop the launch before it starts.
    program = [sys.executable, "-c", "open('marker', 'w').close()"]
    options, env = ([f"--port={port}"], {}) if how == "option" else ([], {"INFERWATCH_PORT": str(port)})
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        status, stdout, stderr = run([*INFERWATCH, "run", *options, "--", *program], tmp_path, env=env)
    assert status == 2
    assert not (tmp_path / "marker").exists()
    assert stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("inferwatch run: ")
    assert f"127.0.0.1:{port}" in lines[0]
    assert "already in use" in lines[0]
    assert "--port" in lines[0] and "INFERWATCH_PORT" in lines[0]


def test_taken_port_does_not_matter_without_the_server(tmp_path: Path, port: int) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        status, _, stderr = run([*INFERWATCH, "run", f"--port={port}", "--no-server", "--", "true"], tmp_path)
    assert status == 0, stderr


def test_unusable_address_exits_2_naming_the_address_flag(tmp_path: Path, port: int) -> None:
    program = [sys.executable, "-c", "open('marker', 'w').close()"]
    status, _, stderr = run(
        [*INFERWATCH, "run", "--addr=192.0.2.1", f"--port={port}", "--", *program], tmp_path
    )
    assert status == 2
    assert not (tmp_path / "marker").exists()
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert f"cannot serve metrics on 192.0.2.1:{port}" in lines[0]
    assert "--addr" in lines[0] and "--port" in lines[0]


def test_missing_program_exits_127(tmp_path: Path) -> None:
    status, _, stderr = run([*INFERWATCH, "run", "--", "no-such-program-inferwatch"], tmp_path)
    assert status == 127
    assert "cannot run 'no-such-program-inferwatch'" in stderr


def test_environment_configures_the_program(tmp_path: Path, port: int) -> None:
    # Options reach the program as the INFERWATCH_* variables its bootstrap reads. A launch from inside
    # another launched program (whose serving marker is in the environment) still serves on its own port.
    show = "import os; print(os.environ['INFERWATCH_PORT'], os.environ['INFERWATCH_TTFT_BUCKETS'])"
    status, stdout, stderr = run(
        [*INFERWATCH, "run", "--ttft-buckets=0.1,1", "--", sys.executable, "-c", show],
        tmp_path,
        env={"INFERWATCH_PORT": str(port), "INFERWATCH_SERVER_PID": "1"},
    )
    assert (status, stdout.split()) == (0, [str(port), "0.1,1"]), stderr
    assert f"serving metrics on http://127.0.0.1:{port}/metrics" in stderr


def test_a_program_that_instruments_its_model_itself_is_counted_once(tmp_path: Path) -> None:
    # The program's own instrument() (before the first generate) wins; the launcher's stand-in steps aside.
    program = write(
        tmp_path / "serve.py",
        """
        import torch
        from inferwatch.instrumentation import instrument
        from prometheus_client import REGISTRY, CollectorRegistry
        from transformers import AutoModelForCausalLM, GPT2Config

        model = AutoModelForCausalLM.from_config(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=99))
        own = CollectorRegistry()
        handle = instrument(model, model_name="own", registry=own)
        prompt = torch.tensor([[1, 2, 3]])
        for _ in range(2):
            model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4,
                           min_new_tokens=4, do_sample=False, pad_token_id=0)
        handle.flush()
        launcher_counted = sum(s.value for family in REGISTRY.collect() for s in family.samples
                               if s.name == "llm_requests_total")
        print(own.get_sample_value("llm_generation_tokens_total", {"model": "own"}), launcher_counted)
        """,
    )
    status, stdout, stderr = run(
        [*INFERWATCH, "run", "--no-server", "--", sys.executable, str(program)], tmp_path
    )
    assert (status, stdout.split()) == (0, ["8.0", "0"]), stderr


# A server with worker processes (spawned, as uvicorn's are): each worker builds its own model and serves
# a known number of tokens, then exits; the program waits to be scraped.
POOL_PROGRAM = """
import multiprocessing, sys, time
from pathlib import Path

def serve(new_tokens):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig
    config = LlamaConfig(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=258)
    model = AutoModelForCausalLM.from_config(config)
    prompt = torch.tensor([[1, 2, 3, 4, 5]])
    model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                   min_new_tokens=new_tokens, do_sample=False)

if __name__ == "__main__":
    workers = [multiprocessing.get_context("spawn").Process(target=serve, args=(n,)) for n in (6, 4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print("workers exited", *[worker.exitcode for worker in workers], flush=True)
    release, deadline = Path(sys.argv[1]), time.monotonic() + 60
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
"""


def test_multiprocess_dir_serves_the_sum_of_worker_processes(tmp_path: Path, port: int) -> None:
    program = write(tmp_path / "pool.py", POOL_PROGRAM)
    multiproc_dir, release = tmp_path / "multiproc", tmp_path / "release"
    multiproc_dir.mkdir()
    (multiproc_dir / "counter_99999.db").write_bytes(b"left over by a previous run")
    url = f"http://127.0.0.1:{port}/metrics"
    command = [
        *INFERWATCH,
        "run",
        f"--port={port}",
        f"--multiprocess-dir={multiproc_dir}",
        "--model-name=pool",
        "--",
        sys.executable,
        str(program),
        str(release),
    ]
    with spawn(command, tmp_path) as process:
        wait_until(
            lambda: "workers exited" in process.stdout() or process.popen.poll() is not None,
            timeout=120,
            what=lambda: f"the workers; stderr:\n{process.stderr()}",
        )
        assert process.stdout().split() == ["workers", "exited", "0", "0"], process.stderr()
        body = http_get(url)[1]
        assert sample_value(body, "llm_requests_total", model="pool", status="ok") == 2
        assert sample_value(body, "llm_generation_tokens_total", model="pool") == 6 + 4
        # The workers exited cleanly: their live gauges left the sums.
        assert sample_value(body, "llm_requests_running", model="pool") is None
        release.touch()
        assert process.wait(60) == 0
    assert not (multiproc_dir / "counter_99999.db").exists()


# Assisted generation under the launcher: a main model and a smaller draft of the same vocabulary, each
# loaded from a directory of its own name (so their `model` labels differ), one user request.
ASSISTED_PROGRAM = """
import sys, tempfile, time
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

def config(layers, hidden):
    return LlamaConfig(
        vocab_size=259, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, bos_token_id=256, eos_token_id=257, pad_token_id=258,
    )

release = Path(sys.argv[1])
root = Path(tempfile.mkdtemp())
torch.manual_seed(0)
AutoModelForCausalLM.from_config(config(2, 64)).save_pretrained(root / "main")
AutoModelForCausalLM.from_config(config(1, 32)).save_pretrained(root / "draft")
main = AutoModelForCausalLM.from_pretrained(root / "main")
draft = AutoModelForCausalLM.from_pretrained(root / "draft")
prompt = torch.tensor([[256, 72, 105, 33, 72, 105, 33]])
out = main.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=draft, max_new_tokens=12,
                    min_new_tokens=12, do_sample=False)
print("generated", out.shape[1] - prompt.shape[1], flush=True)
deadline = time.monotonic() + 60
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def test_an_assisted_request_is_one_request_not_one_per_draft_round(tmp_path: Path, port: int) -> None:
    program = write(tmp_path / "assisted.py", ASSISTED_PROGRAM)
    release = tmp_path / "release"
    url = f"http://127.0.0.1:{port}/metrics"
    command = [*INFERWATCH, "run", f"--port={port}", "--", sys.executable, str(program), str(release)]
    with spawn(command, tmp_path) as process:
        body = wait_until(
            lambda: (
                process.popen.poll() is None
                and "generated" in process.stdout()
                and _body_if(url, "llm_requests_total", 1)
            ),
            timeout=120,
            what=lambda: f"one request on {url}; stderr:\n{process.stderr()}",
        )
        assert "generated 12" in process.stdout()
        assert sample_value(body, "llm_requests_total", model="main") == 1
        assert sample_value(body, "llm_requests_total", model="draft") == 0
        assert sample_value(body, "llm_time_to_first_token_seconds_count", model="main") == 1
        assert sample_value(body, "llm_time_to_first_token_seconds_count", model="draft") == 0
        assert sample_value(body, "llm_generation_tokens_total", model="main") == 12
        assert sample_value(body, "llm_spec_decode_draft_tokens_total", model="main") >= 1
        assert sample_value(body, "llm_forward_seconds_count", model="draft") >= 1  # its device work
        release.touch()
        assert process.wait(60) == 0
