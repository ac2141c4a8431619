"""Container health check for the inferwatch images: exit 0 when an HTTP endpoint answers 200, else 1.

The slim images carry no curl or wget, so Docker's ``HEALTHCHECK`` runs this with the image's Python
(standard library only). With no argument it asks the exporter's ``/-/healthy``, which answers without
waiting on NVML, on the port of the listen address the exporter itself reads from
``INFERWATCH_EXPORTER_WEB_LISTEN_ADDRESS``, so changing that one variable moves both. An argument is a
full URL to ask instead (the serving image passes its ``/metrics``).

Plain HTTP only: with TLS or basic auth from ``--web.config.file``, override the image's health check.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

LISTEN_ADDRESS_ENV = "INFERWATCH_EXPORTER_WEB_LISTEN_ADDRESS"
DEFAULT_LISTEN_ADDRESS = ":8798"
TIMEOUT_SECONDS = 3.0


def local_url(listen_address: str, path: str = "/-/healthy") -> str:
    """The loopback URL of ``path`` on a server that listens on ``listen_address`` (``HOST:PORT``).

    A wildcard or empty host is reached on loopback; a specific host is asked as given.
    """
    host, sep, port = listen_address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen address {listen_address!r} is not HOST:PORT")
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host in ("[::]", "::"):
        host = "[::1]"
    return f"http://{host}:{port}{path}"


def check(url: str) -> str | None:
    """None when ``url`` answers 200 within the time-out, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as resp:
            return None if resp.status == 200 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return str(exc)


def main(argv: list[str]) -> int:
    try:
        url = argv[0] if argv else local_url(os.environ.get(LISTEN_ADDRESS_ENV, DEFAULT_LISTEN_ADDRESS))
    except ValueError as exc:
        print(f"healthcheck: {exc}", file=sys.stderr)
        return 1
    problem = check(url)
    if problem is not None:
        print(f"healthcheck: {url}: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
