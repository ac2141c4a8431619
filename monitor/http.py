"""HTTP GET with failures reduced to one readable line ("connection failed: Connection refused")."""

from __future__ import annotations

from collections.abc import Mapping

import requests


class FetchError(Exception):
    """A URL could not be fetched; the message says why in a few words."""


def fetch(
    url: str,
    timeout: float,
    *,
    params: Mapping[str, str] | None = None,
    accept: str | None = None,
) -> requests.Response:
    """GET ``url``. Network failures raise :class:`FetchError`; HTTP error statuses are returned, since
    some (the Prometheus API's 400 for a bad query) carry an explanation in their body."""
    headers = {"Accept": accept} if accept else {}
    try:
        return requests.get(url, params=params, timeout=timeout, headers=headers)
    except requests.ConnectionError as exc:
        raise FetchError(f"connection failed: {_root_cause(exc)}") from None
    except requests.Timeout:
        raise FetchError(f"no answer within {timeout:g}s") from None
    except requests.RequestException as exc:
        raise FetchError(str(exc)) from None


def _root_cause(exc: BaseException) -> str:
    """The operating system's reason at the bottom of a requests error ("Connection refused", "Name or
    service not known"), instead of urllib3's nested retry description."""
    cause: BaseException | None = exc
    reason = str(exc)
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            reason = cause.strerror
        cause = cause.__cause__ or cause.__context__
    return reason
