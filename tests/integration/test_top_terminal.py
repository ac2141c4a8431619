"""``inferwatch top`` in real terminals of 80x24, 120x40 and 200x50 (tmux), against a real demo endpoint and
the exporter over the NVML stand-in with 8 GPUs: the columns a width must show are there, whole, and no
figure is cut.

The figures of a live demo vary from screen to screen, so the screens are checked for their structure (the
headers, each row's figures whole, the count of hidden columns) rather than byte for byte.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO_ROOT, http_get, sample_value
from tests.support.processes import INFERWATCH
from tests.support.services import start_demo, start_exporter, wait_until
from tests.support.terminal import Terminal, in_terminal

pytestmark = pytest.mark.integration

GPUS = 8
MODEL = "tiny-llama"
#: A figure cut by an ellipsis (``13…``, ``…5 ms``), the failure this guards against.
CUT_FIGURE = re.compile(r"\d…|…\d")
#: Header words of the columns each width must show, models table then GPUs table.
AT_80 = (
    ("model", "TTFT", "ITL", "tok/s", "run/", "wait", "headroom"),
    ("gpu", "util", "memory", "power", "clock", "throttle"),
)
AT_120 = (("queue", "cxl/err", "oldest", "cache", "preempt"), ())
REQUIRED = {80: AT_80, 120: (AT_80[0] + AT_120[0], AT_80[1]), 200: (AT_80[0] + AT_120[0], AT_80[1])}
SIZES = ((80, 24), (120, 40), (200, 50))


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A demo serving requests back to back, and the exporter over 8 stand-in GPUs."""
    env = {
        "INFERWATCH_EXPORTER_NVML_MODULE": "tests.support.fake_nvml",
        "FAKE_NVML_SCENARIO": json.dumps({"gpus": GPUS}),
        "PYTHONPATH": str(REPO_ROOT),
    }
    with (
        start_demo(
            model=MODEL, duration=600.0, max_new_tokens=16, workdir=tmp_path_factory.mktemp("demo")
        ) as demo,
        start_exporter(
            extra_args=["--collector.interval=500ms"], env=env, workdir=tmp_path_factory.mktemp("exporter")
        ) as exporter,
    ):
        # Until the model serves: the screens must have figures to show.
        wait_until(
            lambda: (
                (sample_value(http_get(f"http://{demo[1]}/metrics")[1], "llm_generation_tokens_total") or 0)
                >= 50
            ),
            120,
            "the demo to generate 50 tokens",
        )
        yield demo[1], exporter[1]


def section(screen: list[str], title: str) -> list[str]:
    """The lines of a table: its heading, the header lines, the rule and the rows, to the blank line."""
    start = next(i for i, line in enumerate(screen) if line.startswith(title))
    end = next((i for i in range(start + 1, len(screen)) if not screen[i]), len(screen))
    return screen[start:end]


def header_words(table: list[str]) -> set[str]:
    rule = next(i for i, line in enumerate(table) if line.startswith("─"))
    return {word for line in table[1:rule] for word in line.split()}


def rows(table: list[str]) -> list[list[str]]:
    """Each row's cells: separated by two spaces or more (a cell has single spaces at most)."""
    rule = next(i for i, line in enumerate(table) if line.startswith("─"))
    return [re.split(r"\s{2,}", line.strip()) for line in table[rule + 1 :]]


def top_screen(terminal: Terminal, view: str = "overview") -> list[str]:
    """The first screen with rates (the first one has none), in ``view``."""
    return terminal.wait_for(
        lambda screen: "window" in screen[0] and f"view: {view}" in screen[0] and MODEL in "\n".join(screen),
        60,
        f"a frame with rates in view {view}",
    )


@pytest.mark.parametrize(("columns", "lines"), SIZES, ids=[f"{c}x{r}" for c, r in SIZES])
def test_top_in_a_terminal_shows_whole_columns(
    endpoints: tuple[str, str], tmp_path: Path, columns: int, lines: int
) -> None:
    demo, exporter = endpoints
    top = [*INFERWATCH, "top", "--interval", "1", demo, exporter]
    with in_terminal(top, columns, lines, tmp_path) as terminal:
        screen = top_screen(terminal)
        assert not CUT_FIGURE.search("\n".join(screen)), "\n".join(screen)
        assert all(len(line) <= columns for line in screen)

        models, gpus = section(screen, "models"), section(screen, "GPUs")
        required_models, required_gpus = REQUIRED[columns]
        assert set(required_models) <= header_words(models), models
        assert set(required_gpus) <= header_words(gpus), gpus
        (model_row,) = rows(models)
        assert model_row[0] == MODEL  # the name whole
        # Every figure whole: TTFT's and ITL's pairs end in their unit, tokens/s is a number.
        assert sum(bool(re.fullmatch(r"[\d.]+/[\d.]+ [mµ]?s", cell)) for cell in model_row) == 2, model_row
        assert any(re.fullmatch(r"\d+\.\d", cell) for cell in model_row), model_row
        gpu_rows = rows(gpus)
        visible = lines - len(screen[: screen.index(gpus[0])]) - (len(gpus) - len(gpu_rows))
        assert len(gpu_rows) == min(GPUS, visible)
        for index, row in enumerate(gpu_rows):
            cells = row[1:] if row[0] == exporter else row  # where it fits, the exporter comes first
            assert cells[0] == str(index) and "sw_power_cap" in cells
            assert any(re.fullmatch(r"[\d.]+/[\d.]+ GiB", cell) for cell in cells), row
        # What does not fit is counted, and the way to it given.
        hidden = re.search(r"\+(\d+) columns hidden \(v: views\)", models[0])
        assert (hidden is None) == (columns == 200), models[0]

        # Another view at a key: the memory figures, whole, without a wider terminal.
        terminal.press("m")
        memory = section(top_screen(terminal, "memory"), "models")
        assert {"cache", "headroom", "blocks", "preempt"} <= header_words(memory), memory
        assert not CUT_FIGURE.search("\n".join(memory))
        terminal.press("q")
        terminal.wait_for(lambda _: not terminal.running(), 10, "top to quit at q")
