"""The engines `diagnose` and `compare` measure: from the config (with launch templates) or
already running at `--url`, each with the log and model paths given for it.

`--url`, `--name`, `--log-file` and `--model-path` are given once per engine, in order
(compare takes two); a running engine's kind is asked of its endpoints.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
from pathlib import Path

from config.kinds import ENGINES, KINDS
from config.settings import Config, EngineConfig
from diagnose.probe import probe_url
from loadgen.options import UsageError, listed
from loadgen.resolve import api_key, engine_name, engines_from_config


def measured_engines(
    command: str, args: argparse.Namespace, config: Config | None
) -> list[EngineConfig]:
    """The command's engines (diagnose one, compare two); UsageError otherwise."""
    given = len(args.engine) or len(listed(args.url))
    # Counted before any engine is asked what it is.
    wanted = given in (0, 1 if command == "diagnose" else 2)
    engines = engines_from_args(args, config) if wanted else []
    if command == "diagnose" and len(engines) != 1:
        raise UsageError("diagnose measures one engine: give one --engine (compare takes two)")
    if command == "compare" and len(engines) != 2:
        raise UsageError(
            "compare needs two engines: --engine A --engine B, or --url A --url B (A in use)"
        )
    if args.exporter_url and args.log_file:
        raise UsageError(
            "--log-file is read by diagnose's own collectors; with --exporter-url the "
            "exporter reads the log its config names (log_file)"
        )
    return engines


def engines_from_args(args: argparse.Namespace, config: Config | None) -> list[EngineConfig]:
    """Engines from --engine (config, with launch templates) or --url (already running),
    with the --log-file and --model-path given for them, in order."""
    engines = engines_from_config(args, config)
    if not engines:
        urls, names = listed(args.url), listed(args.name)
        if len(names) > len(urls):
            raise UsageError(f"--name is given {len(names)} times for {len(urls)} --url")
        key = api_key(args)  # an unset --api-key-env is an error here as in run
        for url, name in itertools.zip_longest(urls, names[: len(urls)]):
            engine = url_engine(url, args, key, name)
            if any(e.name == engine.name for e in engines):  # two servers of one model
                engine = engine.model_copy(update={"name": f"{engine.name}-{len(engines) + 1}"})
            engines.append(engine)
    logs, models = listed(args.log_file), listed(args.model_path)
    return with_paths(engines, [Path(p) for p in logs], [Path(p) for p in models])


def url_engine(
    url: str, args: argparse.Namespace, key: str | None, name: str | None
) -> EngineConfig:
    """An engine already running at `url`: its kind (asked of it unless given) and name."""
    kind, model = asyncio.run(probe_url(url, key, args.kind, model=not name))
    if kind not in KINDS:
        endpoints = " nor ".join(f"{e.display}'s {e.info.paths[0]}" for e in ENGINES)
        raise UsageError(
            f"{url} answers neither {endpoints}; pass " + " or ".join(f"--kind {k}" for k in KINDS)
        )
    name = name or model or kind
    return EngineConfig(name=engine_name(name), kind=kind, url=url, api_key_env=args.api_key_env)


def with_paths(
    engines: list[EngineConfig], logs: list[Path], models: list[Path]
) -> list[EngineConfig]:
    """The engines with --log-file / --model-path (the i-th of each for the i-th engine)."""
    for flag, paths in (("--log-file", logs), ("--model-path", models)):
        if len(paths) > len(engines):
            raise UsageError(f"{flag} is given {len(paths)} times for {len(engines)} engine(s)")
        for path in paths:
            readable = path.is_file() if flag == "--log-file" else path.exists()
            if not readable or not os.access(path, os.R_OK):
                what = "file" if flag == "--log-file" else "file or folder"
                raise UsageError(f"{flag} {path}: not a readable {what} on this machine")
    out = []
    for i, engine in enumerate(engines):
        update: dict[str, Path] = {}
        if i < len(logs):
            update["log_file"] = logs[i]
        if i < len(models):
            update["model_path"] = models[i]
        out.append(engine.model_copy(update=update))
    return out


def path_origins(args: argparse.Namespace, engines: list[EngineConfig]) -> dict[str, str]:
    """Where each engine's log and model path came from: "<engine>.log" -> the flag's name."""
    origins = {}
    for flag, key, given in (
        ("--log-file", "log", listed(args.log_file)),
        ("--model-path", "model", listed(args.model_path)),
    ):
        for engine in engines[: len(given)]:
            origins[f"{engine.name}.{key}"] = flag
    return origins
