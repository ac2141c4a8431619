"""``inferwatch-exporter`` and ``python -m inferwatch.exporter``: check the configuration, bind, serve."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from types import ModuleType

from inferwatch.common.heap import return_freed_memory, trim_freed_memory
from inferwatch.common.webconfig import check_reload, load_web_config

from .config import ENV_PREFIX, PROG, ExporterConfig, parse_config
from .errors import ConfigError, ListenError
from .exposition import ScrapeRenderer
from .nvml import load_binding
from .poller import Poller
from .server import ExporterServer

log = logging.getLogger("inferwatch.exporter")

# SIGTERM and SIGINT stop the exporter; SIGHUP reloads the web config file.
_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("inferwatch")
    except PackageNotFoundError:
        return "unknown"


def load_nvml(config: ExporterConfig) -> ModuleType | None:
    """The NVML binding, or None (logged once) when it cannot be imported: GPU metrics are then off."""
    try:
        return load_binding(config.nvml_module)
    except ImportError as exc:
        log.warning(
            "NVML binding %r cannot be imported (%s); serving host metrics with inferwatch_nvml_up 0",
            config.nvml_module,
            exc,
        )
        return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the exporter until SIGTERM or SIGINT (exit 0); 2 on bad configuration."""
    return_freed_memory()
    # Until the loop handles them, the stop signals wait (pending) instead of killing the process, and
    # every thread started meanwhile keeps them blocked, so they reach the main thread.
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    prepared = _prepare(argv)
    if isinstance(prepared, int):
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        return prepared
    return asyncio.run(_serve(*prepared))


def _prepare(argv: Sequence[str] | None) -> int | tuple[ExporterConfig, Poller, ExporterServer]:
    """Everything checked and bound, or the exit status when there is nothing to serve."""
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv, os.environ)
        if config is None:
            print(f"{PROG} {version()}")
            return 0
        logging.basicConfig(
            level=config.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
        web = load_web_config(config.web_config_file)
        poller = Poller(config, load_nvml(config), version())
        server = ExporterServer(
            config.listen_host,
            config.listen_port,
            ScrapeRenderer(poller),
            poller.ready,
            config.telemetry_path,
            web,
        )
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except ListenError as exc:
        # The server's message names the address; the command adds how to choose another.
        flag = f"--web.listen-address (or ${ENV_PREFIX}WEB_LISTEN_ADDRESS)"
        print(f"{PROG}: {exc.strerror}; change {flag}", file=sys.stderr)
        return 2
    return config, poller, server


async def _serve(config: ExporterConfig, poller: Poller, server: ExporterServer) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    reloads: set[asyncio.Task[None]] = set()  # held until done: the loop keeps only weak references

    def reload() -> None:
        task = loop.create_task(_reload(config, server))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, reload)
    trimming = loop.create_task(trim_freed_memory())  # held: the loop keeps only a weak reference
    poller.start()  # its threads keep the signals blocked: they are the main thread's
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    await server.start()
    scheme = "https" if server.web.ssl_context is not None else "http"
    log.info("serving %s://%s%s", scheme, config.listen_address, config.telemetry_path)
    await stop.wait()
    # Blocked again for good: a second signal while the process exits must not kill it mid-way.
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    log.info("shutting down")
    trimming.cancel()
    await server.stop()
    poller.stop()
    return 0


async def _reload(config: ExporterConfig, server: ExporterServer) -> None:
    """SIGHUP: read the web config file again; a file that does not load, or that would turn TLS or auth
    off, leaves the previous one in use (and ``..._last_reload_successful`` 0)."""
    if not config.web_config_file:
        log.info("SIGHUP: no --web.config.file to reload")
        return
    try:
        # Off the loop: loading checks every bcrypt hash, tens of milliseconds each.
        web = await asyncio.get_running_loop().run_in_executor(None, load_web_config, config.web_config_file)
        check_reload(server.web, web, config.web_config_file)
    except ConfigError as exc:
        log.error("SIGHUP: %s; keeping the previous web configuration", exc)
        server.exposition.reloads.record(ok=False)
        return
    await server.apply_web_config(web)
    server.exposition.reloads.record(ok=True)
    log.info("SIGHUP: web configuration reloaded from %s", config.web_config_file)


if __name__ == "__main__":
    sys.exit(main())
