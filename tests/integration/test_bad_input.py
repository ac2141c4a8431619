"""Bad input to the commands, as a person types it: one line naming what is wrong and exit status 2, never
a traceback (the cases that gave one before issue 29)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO_ROOT

pytestmark = pytest.mark.integration


def run(args: list[str], **env: str) -> tuple[int, list[str]]:
    """Exit status and the stderr lines of a command (``inferwatch-exporter`` or ``inferwatch ...``)."""
    # "exporter" stands for inferwatch-exporter; anything else is an inferwatch subcommand.
    module, rest = ("inferwatch.exporter", args[1:]) if args[0] == "exporter" else ("inferwatch.cli", args)
    done = subprocess.run(
        [sys.executable, "-m", module, *rest],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env},
        stdin=subprocess.DEVNULL,
    )
    return done.returncode, done.stderr.strip().splitlines()


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("")
    return path


@pytest.mark.parametrize(
    ("args", "env", "line"),
    [
        (
            ["top", "--once", "not a url"],
            {},
            "inferwatch top: 'not a url' is not an http(s) URL or HOST:PORT",
        ),
        (
            ["top", "--once", "localhost:99999"],
            {},
            "inferwatch top: 'localhost:99999' is not a URL: Port out",
        ),
        (["demo", "--model", "{empty}"], {}, "inferwatch demo: --model: '{empty}' has no config.json"),
        (
            ["dashboards", "export", "{file}"],
            {},
            "inferwatch dashboards: cannot write into {file}: it is a file",
        ),
        (
            ["alerts", "export", "{file}/x"],
            {},
            "inferwatch alerts: cannot write {file}/x/rules.yaml: Not a dir",
        ),
        (
            ["alerts", "render", "--out", "{file}"],
            {},
            "inferwatch alerts: cannot write into {file}: it is a file",
        ),
        (
            ["exporter"],
            {"INFERWATCH_EXPORTER_NVML_MODULE": ""},
            "inferwatch-exporter: INFERWATCH_EXPORTER_NVML_MODULE: '' is not a module name",
        ),
        (
            ["exporter", "--gpus=0,0"],
            {},
            "inferwatch-exporter: argument --gpus: '0,0' names 0 more than once",
        ),
        (
            ["exporter"],
            {"INFERWATCH_EXPORTER_GPUS": "0,,1"},
            "inferwatch-exporter: INFERWATCH_EXPORTER_GPUS: '0,,1' is not 'all' or a list",
        ),
        (
            ["run", "--", "true"],
            {"INFERWATCH_STOP_GENERATION_ON_DISCONNECT": "maybe"},
            "inferwatch run: INFERWATCH_STOP_GENERATION_ON_DISCONNECT must be 1 or 0, got 'maybe'",
        ),
        (
            ["run", "--", "true"],
            {"INFERWATCH_HTTP_PROCESS": "yes"},
            "inferwatch run: INFERWATCH_HTTP_PROCESS must be 1 or 0, got 'yes'",
        ),
        # A web config the endpoint cannot use: both commands that start one refuse it before anything
        # starts (the demo gave a traceback and exit 1, issue 48).
        (
            ["run", "--", "true"],
            {"INFERWATCH_WEB_CONFIG_FILE": "{empty}/none.yml"},
            "inferwatch run: --web.config.file {empty}/none.yml: [Errno 2] No such file",
        ),
        (
            ["run", "--", "true"],
            {"INFERWATCH_RUN_MAX_COLLECTION_BYTES": "12"},
            "inferwatch run: INFERWATCH_RUN_MAX_COLLECTION_BYTES must be a number of bytes of at least 65536",
        ),
        (
            ["demo", "--port=0"],
            {"INFERWATCH_WEB_CONFIG_FILE": "{empty}/none.yml"},
            "inferwatch demo: --web.config.file {empty}/none.yml: [Errno 2] No such file",
        ),
        (
            ["exporter", "--web.telemetry-path=/a b"],
            {},
            "inferwatch-exporter: argument --web.telemetry-path:",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, a_file: Path, args: list[str], env: dict[str, str], line: str
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    fill = {"{empty}": str(empty), "{file}": str(a_file)}
    for key, value in fill.items():
        args = [arg.replace(key, value) for arg in args]
        env = {name: setting.replace(key, value) for name, setting in env.items()}
        line = line.replace(key, value)
    status, lines = run(args, **env)
    assert status == 2, lines
    assert len(lines) == 1 and lines[0].startswith(line), lines


def test_a_prompt_beyond_the_models_context_is_refused_once_the_model_is_built() -> None:
    status, lines = run(["demo", "--port=0", "--prompt-len-range", "1", "100000"])
    assert status == 2, lines
    assert lines[-1] == (
        "inferwatch demo: --prompt-len-range: MAX 100000 plus --max-new-tokens 64 is beyond the model's "
        "4096 positions"
    ), lines
    assert not any("Traceback" in line for line in lines)
