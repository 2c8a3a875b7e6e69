"""Command line: `llmb-exporter --config FILE` (or `python -m exporter`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from exporter import __version__
from exporter.config import ConfigError, load_config

EXIT_CONFIG = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="llmb-exporter",
        description="Prometheus exporter: GPU memory (NVML) + llama.cpp and SGLang metrics "
        "in one llmb_* schema.",
    )
    parser.add_argument(
        "--config",
        "--config.file",
        dest="config",
        default=os.environ.get("LLMB_CONFIG"),
        help="YAML config file (env LLMB_CONFIG); see config.example.yaml",
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
        "--log-level",
        default=os.environ.get("LLMB_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log verbosity (env LLMB_LOG_LEVEL)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.log_level != "DEBUG":
        # One line per engine request would drown the collectors' own messages.
        logging.getLogger("httpx").setLevel(logging.WARNING)
    env = dict(os.environ)
    if args.listen:
        env["LLMB__LISTEN"] = args.listen
    try:
        config = load_config(args.config, env)
    except ConfigError as exc:
        print(f"llmb-exporter: invalid configuration ({len(exc.errors)} errors):", file=sys.stderr)
        for err in exc.errors:
            print(f"  - {err}", file=sys.stderr)
        return EXIT_CONFIG
    if args.check_only:
        print(
            f"configuration OK: {len(config.engines)} engines, "
            f"gpu {'on' if config.gpu.enabled else 'off'}"
        )
        return 0

    from aiohttp import web

    from exporter.app import build_runner
    from exporter.server import make_app

    runner = build_runner(config)
    app = make_app(runner)
    logging.getLogger(__name__).info(
        "serving on http://%s:%d/metrics (%d engines)",
        config.listen_host,
        config.listen_port,
        len(config.engines),
    )
    web.run_app(app, host=config.listen_host, port=config.listen_port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
