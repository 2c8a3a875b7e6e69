"""The engines `diagnose` and `compare` measure: from the config (with launch templates) or
already running at `--url`, each with the log and model paths given for it.

`--url`, `--name`, `--log-file` and `--model-path` are given once per engine, in order
(compare takes two). A running engine is probed once, by the load generator's resolver
(`loadgen.resolve.url_targets`): its kind (asked of its endpoints unless `--kind` says it),
its model and its info endpoint, handed on to the facts by engine name (`Measured.probes`).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

from config.kinds import engines, kinds
from config.settings import Config, EngineConfig
from loadgen.client import TargetUnreachable
from loadgen.options import UsageError, listed
from loadgen.resolve import TargetProbe, api_key, engine_name, engines_from_config, url_targets


@dataclass(frozen=True)
class Measured:
    """The engines a command measures, and the probe of each running one (by engine name)."""

    engines: list[EngineConfig]
    probes: dict[str, TargetProbe] = field(default_factory=dict)


def measured_engines(command: str, args: argparse.Namespace, config: Config | None) -> Measured:
    """The command's engines (diagnose one, compare two); UsageError otherwise."""
    given = len(args.engine) or len(listed(args.url))
    # Counted before any engine is asked what it is.
    wanted = given in (0, 1 if command == "diagnose" else 2)
    measured = engines_from_args(args, config) if wanted else Measured([])
    engines = measured.engines
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
    return measured


def engines_from_args(args: argparse.Namespace, config: Config | None) -> Measured:
    """Engines from --engine (config, with launch templates) or --url (already running, each
    probed once), with the --log-file and --model-path given for them, in order."""
    configured = engines_from_config(args, config)
    probes: dict[str, TargetProbe] = {}
    if not configured:
        key = api_key(args)  # an unset --api-key-env is an error here as in run
        for target in url_targets(args, key, info=True, label=_running_label):
            assert target.probe is not None  # info=True probes every target
            if target.probe.unreachable is not None:
                raise TargetUnreachable(
                    f"cannot reach {target.url} ({target.probe.unreachable}): is the engine "
                    "running there?"
                )
            if target.probe.kind not in kinds():
                endpoints = " nor ".join(f"{e.display}'s {e.info.paths[0]}" for e in engines())
                # The OpenAI base URL is the usual slip: the engine's own endpoints sit above.
                base = " (give the server's address without /v1)" if _is_v1(target.url) else ""
                raise UsageError(
                    f"{target.url} answers neither {endpoints}{base}; pass "
                    + " or ".join(f"--kind {k}" for k in kinds())
                )
            configured.append(
                EngineConfig(
                    name=target.name,
                    kind=target.probe.kind,
                    url=target.url,
                    api_key_env=args.api_key_env,
                )
            )
            probes[target.name] = target.probe
    logs, models = listed(args.log_file), listed(args.model_path)
    paths = with_paths(configured, [Path(p) for p in logs], [Path(p) for p in models])
    return Measured(paths, probes)


def _is_v1(url: str) -> bool:
    return url.rstrip("/").endswith("/v1")


def _running_label(name: str | None, probe: TargetProbe | None) -> str:
    """A running engine's name: --name, else its model, else its kind (a config name)."""
    assert probe is not None
    return engine_name(name or probe.model or probe.kind)


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
