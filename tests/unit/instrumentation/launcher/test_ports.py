"""Default ports that do not collide, and a taken port reported before anything starts."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator

import pytest

from inferwatch.exporter.config import DEFAULT_PORT as EXPORTER_PORT
from inferwatch.instrumentation.endpoint.server import DEFAULT_PORT as SERVING_PORT
from inferwatch.instrumentation.endpoint.server import ListenError, PortInUseError
from inferwatch.instrumentation.launcher.command import check_port_free, with_flag_hint

# The defaults of what runs beside inferwatch: vLLM, Triton, `transformers serve`, uvicorn/FastAPI (8000),
# Triton's gRPC (8001), TGI, llama.cpp and TorchServe (8080), Grafana (3000), SGLang (30000), Prometheus
# (9090), Alertmanager (9093), node_exporter (9100), dcgm-exporter (9400), nvidia_gpu_exporter (9835).
TAKEN_BY_OTHERS = {8000, 8001, 8080, 3000, 30000, 9090, 9093, 9100, 9400, 9835}


def test_defaults_avoid_common_stacks_and_the_exporter_port_range() -> None:
    for port in (SERVING_PORT, EXPORTER_PORT):
        assert port not in TAKEN_BY_OTHERS
        # Prometheus' default port allocations hand out 9100-9999 to exporters.
        assert not 9100 <= port <= 9999
    assert SERVING_PORT != EXPORTER_PORT


@pytest.fixture
def held() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_taken_port_raises_port_in_use_naming_it(held: int) -> None:
    with pytest.raises(PortInUseError) as caught:
        check_port_free("127.0.0.1", held)
    assert isinstance(caught.value, OSError)
    assert caught.value.errno == errno.EADDRINUSE
    assert caught.value.strerror == f"cannot serve metrics on 127.0.0.1:{held}: the address is already in use"


def test_port_zero_and_a_free_port_pass() -> None:
    check_port_free("127.0.0.1", 0)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    check_port_free("127.0.0.1", free)


def test_an_address_not_of_this_host_is_a_listen_error() -> None:
    with pytest.raises(ListenError) as caught:
        check_port_free("192.0.2.1", 1)
    assert not isinstance(caught.value, PortInUseError)
    assert "192.0.2.1:1" in caught.value.strerror


def test_the_hint_names_the_port_flag_or_both() -> None:
    taken = with_flag_hint(
        PortInUseError(errno.EADDRINUSE, "cannot serve metrics on a:1: in use"), "--p", "--a"
    )
    assert isinstance(taken, PortInUseError) and taken.errno == errno.EADDRINUSE
    assert taken.strerror == "cannot serve metrics on a:1: in use; pick another port with --p"
    other = with_flag_hint(ListenError(errno.EADDRNOTAVAIL, "cannot serve metrics on a:1: no"), "--p", "--a")
    assert type(other) is ListenError
    assert other.strerror == "cannot serve metrics on a:1: no; change --a or --p"
