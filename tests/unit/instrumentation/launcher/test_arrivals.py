"""The arrival table of ``transformers serve``'s processes: shared with processes started afresh, and no
file on any file system unless the system has no anonymous files."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from inferwatch.instrumentation.launcher.transformers_serve import arrivals
from inferwatch.instrumentation.launcher.transformers_serve.arrivals import (
    ARRIVALS_ENV,
    ArrivalTable,
    create_table_file,
)

# A process of the program started afresh (as multiprocessing's spawn or subprocess start them: no
# descriptor of its parent's but the standard ones): it reads what the parent put, and puts its own.
_CHILD = """
import os
from inferwatch.instrumentation.launcher.transformers_serve.arrivals import program_table
table = program_table()
print(table.get(7))
table.put(65536 + 8, 3.25)
"""


def test_the_table_is_shared_with_a_process_started_afresh_and_is_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    table_file = create_table_file()
    try:
        assert not table_file.temporary
        assert table_file.path == f"/proc/{os.getpid()}/fd/{table_file.fd}"
        assert list(tmp_path.iterdir()) == []
        table = ArrivalTable(table_file.path)
        table.put(7, 12.5)
        child = subprocess.run(
            [sys.executable, "-c", _CHILD],
            env={**os.environ, ARRIVALS_ENV: table_file.path},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert child.returncode == 0, child.stderr
        assert child.stdout.split() == ["12.5"]
        assert table.get(65536 + 8) == 3.25
        assert table.get(8) is None  # the same slot, another request's id
    finally:
        assert table_file.fd is not None
        os.close(table_file.fd)


def test_without_anonymous_files_the_table_is_a_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*args: object) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(os, "memfd_create", refused)
    table_file = create_table_file()
    assert table_file.temporary and table_file.fd is None
    assert [path.name for path in tmp_path.iterdir()] == [Path(table_file.path).name]
    table = ArrivalTable(table_file.path)
    table.put(3, 1.5)
    assert ArrivalTable(table_file.path).get(3) == 1.5


def test_a_table_that_cannot_be_opened_is_said_not_silently_dropped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The owner gone, or its /proc closed to this process: the requests here lose their arrival time,
    and the log says so."""
    monkeypatch.setattr(arrivals, "_table", None)
    monkeypatch.setattr(arrivals, "_table_tried", False)
    monkeypatch.setenv(ARRIVALS_ENV, "/proc/999999999/fd/3")
    with caplog.at_level("WARNING", logger=arrivals.__name__):
        assert arrivals.program_table() is None
    assert "/proc/999999999/fd/3" in caplog.text and "entry into the engine" in caplog.text


def test_requests_of_several_api_servers_do_not_share_slots(tmp_path: Path) -> None:
    """transformers' ids are ``api_server * 2**40 + n``: every API server's n-th request has the same id
    modulo any power of two up to 2**40, so the slot must depend on the server too. 1000 requests from
    four API servers, all in flight at once (put, then read), are all found."""
    from transformers.cli.serving.utils import make_request_id

    path = tmp_path / "table"
    path.write_bytes(b"\0" * (arrivals._SLOT.size * arrivals.SLOTS))
    table = ArrivalTable(str(path))
    ids = [make_request_id(server, n) for n in range(250) for server in range(4)]
    for index, request_id in enumerate(ids):
        table.put(request_id, float(index))
    found = [table.get(request_id) for request_id in ids]
    assert found == [float(index) for index in range(len(ids))]


def test_a_requests_last_delivery_goes_with_its_arrival_and_only_into_its_own_slot() -> None:
    """The API process writes when it last sent a chunk of a request's response; the engine reads it at
    the request's cancel. A new request in the slot starts with none, and a late write for the request
    the slot held before does not reach the new one."""
    table_file = create_table_file()
    try:
        table = ArrivalTable(table_file.path)
        table.put(7, 1.0)
        assert table.delivered(7) is None
        table.put_delivery(7, 2.5)
        assert (table.get(7), table.delivered(7)) == (1.0, 2.5)
        table.put(7 + arrivals.SLOTS, 3.0)  # the slot's next request
        table.put_delivery(7, 4.0)
        assert table.delivered(7) is None
        assert table.delivered(7 + arrivals.SLOTS) is None
    finally:
        if table_file.fd is not None:
            os.close(table_file.fd)
        elif table_file.temporary:
            os.unlink(table_file.path)
