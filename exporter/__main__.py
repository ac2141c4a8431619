"""``inferwatch-exporter`` and ``python -m inferwatch.exporter``: check the configuration, bind, serve."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import ModuleType

from .config import ENV_PREFIX, PROG, ExporterConfig, parse_config
from .errors import ConfigError, ListenError
from .exposition import Exposition
from .nvml import load_binding
from .poller import Poller
from .server import ExporterServer
from .webconfig import load_web_config

log = logging.getLogger("inferwatch.exporter")


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
    """Run the exporter until SIGTERM or SIGINT; 2 on bad configuration."""
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv, os.environ)
        if config is None:
            print(f"{PROG} {version()}")
            return 0
        web = load_web_config(config.web_config_file)
        logging.basicConfig(
            level=config.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
        poller = Poller(config, load_nvml(config), version())
        server = ExporterServer(
            config.listen_host,
            config.listen_port,
            Exposition(poller),
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

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    poller.start()
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    scheme = "https" if web.ssl_context is not None else "http"
    log.info("serving %s://%s%s", scheme, config.listen_address, config.telemetry_path)
    stop.wait()
    log.info("shutting down")
    server.shutdown()
    server.server_close()
    poller.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
