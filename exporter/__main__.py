"""Command line: `llmb-exporter --config FILE` (or `python -m exporter`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys

from config.settings import Config, ConfigError, config_file_from_env, load_config
from core import series as llmb
from exporter import __version__
from exporter.cli import add_log_level_option, setup_logging
from exporter.web_config import WebConfig
from model.host_memory import HostBandwidth, host_bandwidth

EXIT_CONFIG = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="llmb-exporter",
        description="Prometheus exporter: GPU memory (NVML) + llama.cpp and SGLang metrics "
        "in one llmb_* schema.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--config",
        "--config.file",
        dest="config",
        default=config_file_from_env(),
        help="YAML config file (env LLMB_CONFIG_FILE); see config.example.yaml",
    )
    parser.add_argument(
        "--check-only",
        action="store_true",
        help="validate the config, print every error, and exit (0 valid, 2 invalid)",
    )
    parser.add_argument(
        "--listen",
        "--web.listen-address",
        dest="listen",
        help="HOST:PORT to serve /metrics on (overrides the config's listen)",
    )
    parser.add_argument(
        "--web.config.file",
        dest="web_config",
        default=os.environ.get("LLMB_WEB_CONFIG"),
        help="TLS and basic auth, in the format of Prometheus' exporter-toolkit (env "
        "LLMB_WEB_CONFIG; docs/security.md); default: plain HTTP without auth",
    )
    parser.add_argument(
        "--host-bandwidth-gbs",
        type=_positive_gbs,
        metavar="GB/S",
        help="host memory bandwidth for the expert-offload bound "
        f'({llmb.HOST_MEMORY_BANDWIDTH_BYTES_PER_SECOND}{{source="flag"}}); default: the '
        "config's host_memory_bandwidth_bytes_per_second, else measured once at start "
        "(a multi-threaded copy, under a second)",
    )
    add_log_level_option(parser, "log verbosity (env LLMB_LOG_LEVEL)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser.parse_args(argv)


def _positive_gbs(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of GB/s, not {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.log_level)
    env = dict(os.environ)
    if args.listen:
        env["LLMB__LISTEN"] = args.listen
    errors: list[str] = []
    config: Config | None = None
    web: WebConfig | None = None
    try:
        config = load_config(args.config, env)
    except ConfigError as exc:
        errors.extend(exc.errors)
    if args.web_config:
        from exporter.web_config import load_web_config

        try:
            web = load_web_config(args.web_config)
        except ConfigError as exc:
            errors.extend(f"--web.config.file {e}" for e in exc.errors)
    if errors or config is None:
        print(f"llmb-exporter: invalid configuration ({len(errors)} errors):", file=sys.stderr)
        for err in errors:
            print(f"  - {err}", file=sys.stderr)
        return EXIT_CONFIG
    if args.check_only:
        print(
            f"configuration OK: {len(config.engines)} engines, "
            f"gpu {'on' if config.gpu.enabled else 'off'}"
        )
        return 0
    try:
        sock = bind(config.listen_host, config.listen_port)
    except OSError as exc:
        print(
            f"llmb-exporter: cannot listen on {config.listen}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    announce_engines(config)
    flag = args.host_bandwidth_gbs * 1e9 if args.host_bandwidth_gbs else None
    bandwidth = host_bandwidth(flag, config.host_memory_bandwidth_bytes_per_second)
    if bandwidth is not None:
        logging.getLogger("exporter").info("host memory bandwidth %s", bandwidth.describe())
    return serve(config, web, sock, bandwidth)


def announce_engines(config: Config) -> None:
    """One line per engine at start: what is read, from where (an engine left out is none)."""
    log = logging.getLogger("exporter")
    if not config.engines:
        log.info("no engine configured: the GPU only")
    for e in config.engines:
        log.info(
            "engine %s (%s) at %s; log %s; model %s",
            e.name, e.kind, e.url, e.log_file or "not configured", e.model_path or "not configured",
        )  # fmt: skip


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on HOST:PORT; OSError when the port is taken or the address
    is not this host's (bound here so that both are one-line errors, not tracebacks)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def serve(
    config: Config,
    web_config: WebConfig | None,
    sock: socket.socket,
    host_bandwidth: HostBandwidth | None = None,
) -> int:
    """Run the exporter on a bound socket until interrupted."""
    from aiohttp import web

    from exporter.app import build_runner
    from exporter.server import make_app
    from exporter.web_config import BasicAuth, describe, ssl_context

    runner = build_runner(config, host_bandwidth=host_bandwidth)
    users = web_config.basic_auth_users if web_config is not None else None
    app = make_app(runner, BasicAuth(users) if users else None)
    context = ssl_context(web_config) if web_config is not None else None
    logging.getLogger(__name__).info(
        "serving on %s://%s:%d/metrics (%d engines; %s)",
        "https" if context else "http",
        config.listen_host,
        config.listen_port,
        len(config.engines),
        describe(web_config) if web_config is not None else "no TLS, no auth",
    )
    web.run_app(
        app, sock=sock, ssl_context=context, print=None, access_log=None, loop=_event_loop()
    )
    return 0


def _event_loop() -> asyncio.AbstractEventLoop | None:
    """uvloop when installed: ~20 % less CPU per scrape (docs/benchmarks.md); else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


if __name__ == "__main__":
    sys.exit(main())
