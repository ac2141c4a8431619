"""The test harness's clients hold the test process's garbage collector off while they time requests
(:mod:`tests.support.clienttiming`): until the last of several concurrent clients is done, and no longer."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from tests.support.clienttiming import without_gc_pauses


@pytest.fixture
def collector_enabled() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


@pytest.mark.usefixtures("collector_enabled")
def test_the_collector_waits_until_the_last_concurrent_client_is_done() -> None:
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def first() -> None:
        with without_gc_pauses():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second() -> None:
        first_in.wait(5)
        with without_gc_pauses():
            second_in.set()
            first_out.wait(5)
            seen["after the first left"] = gc.isenabled()
        seen["after both left"] = gc.isenabled()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == {"after the first left": False, "after both left": True}


def test_a_collector_that_was_off_stays_off() -> None:
    was = gc.isenabled()
    gc.disable()
    try:
        with without_gc_pauses():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        if was:
            gc.enable()
