"""HTTP requests with the standard library, failures reduced to one readable line ("connection failed:
Connection refused"). No third-party client: ``top --json`` and ``diagnose --json`` then run wherever
Python does, the GPU machines with nothing but torch included."""

from __future__ import annotations

import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass


class FetchError(Exception):
    """A URL could not be fetched; the message says why in a few words."""


@dataclass(frozen=True)
class Response:
    status: int
    reason: str
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def fetch(
    url: str,
    timeout: float,
    *,
    params: Mapping[str, str] | None = None,
    accept: str | None = None,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> Response:
    """``method`` (GET by default) ``url``. Network failures raise :class:`FetchError`; HTTP error statuses
    are returned, since some (the Prometheus API's 400 for a bad query) carry an explanation in their
    body. ``context`` is the TLS context of an ``https`` URL (default: the system's CAs)."""
    if params:
        url = f"{url}?{urllib.parse.urlencode(params)}"
    fields = {**(headers or {}), **({"Accept": accept} if accept else {})}
    request = urllib.request.Request(url, headers=fields, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:
            return Response(answer.status, answer.reason, answer.read())
    except urllib.error.HTTPError as error:
        with error:
            return Response(error.code, str(error.reason), error.read())
    except urllib.error.URLError as error:
        if isinstance(error.reason, socket.timeout | TimeoutError):
            raise FetchError(f"no answer within {timeout:g}s") from None
        reason = getattr(error.reason, "strerror", None) or str(error.reason)
        raise FetchError(f"connection failed: {reason}") from None
    except TimeoutError:  # the connection was made, the answer did not come
        raise FetchError(f"no answer within {timeout:g}s") from None
    except OSError as error:  # reset by peer, and the like
        raise FetchError(f"connection failed: {error.strerror or error}") from None
