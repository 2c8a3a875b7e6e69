"""The one target and config resolver of every subcommand (run, sweep, diagnose, compare).

`--config FILE` is loaded by `load_config_or_usage`; `--engine NAME` (with the config) or
`--url URL` is checked by `engines_from_config`, which owns the error messages; a bare URL is
named after its model by `label_from_server`. `diagnose` builds on these (it may import
`loadgen`; nothing in `loadgen` imports `diagnose`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
from pathlib import Path

from config.settings import Config, ConfigError, EngineConfig, load_config
from loadgen.client import probe_client, server_model_async
from loadgen.options import UsageError, listed
from loadgen.target import Target


def load_config_or_usage(path: str | Path | None) -> Config | None:
    """The config at `path` (None without one), or UsageError with every validation error."""
    if not path:
        return None
    try:
        return load_config(Path(path))
    except ConfigError as exc:
        raise UsageError(
            f"invalid configuration {path}:\n" + "\n".join(f"  - {e}" for e in exc.errors)
        ) from None


def engines_from_config(args: argparse.Namespace, config: Config | None) -> list[EngineConfig]:
    """The engines named by --engine, [] with --url; UsageError when the target flags clash."""
    if args.url and args.engine:
        raise UsageError("use either --engine NAME (with --config) or --url, not both")
    if args.url:
        return []
    if not args.engine:
        raise UsageError("no target: give --url URL, or --config FILE with --engine NAME")
    if config is None:
        raise UsageError("--engine needs --config FILE (or env LLMB_CONFIG_FILE)")
    if len(set(args.engine)) != len(args.engine):
        raise UsageError("the same --engine is given twice")
    out = []
    for name in args.engine:
        try:
            out.append(config.engine(name))
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from None
    return out


def api_key(args: argparse.Namespace, required: bool = True) -> str | None:
    """The API key of a --url target from --api-key-env (UsageError when `required` and unset)."""
    if not args.api_key_env:
        return None
    key = os.environ.get(args.api_key_env)
    if key is None and required:
        raise UsageError(f"--api-key-env {args.api_key_env}: the variable is not set")
    return key


def model_label(model: str) -> str:
    """A model id as an engine label: the file name of a path, without `.gguf`."""
    name = model.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    if name.lower().endswith(".gguf"):
        name = name[: -len(".gguf")]
    return name.strip()


def engine_name(model: str) -> str:
    """A model id as a config engine name (letters, digits, `_.-`, not starting with a digit)."""
    clean = "".join(c if c.isalnum() or c in "_.-" else "_" for c in model_label(model))
    return clean if clean and (clean[0].isalpha() or clean[0] == "_") else "m_" + clean


def server_model(url: str, api_key: str | None, timeout: float) -> str | None:
    """The first model id of the server's /v1/models, None when nothing answers."""

    async def ask() -> str | None:
        async with probe_client(url, api_key, timeout) as client:
            return await server_model_async(client, timeout)

    return asyncio.run(ask())


def label_from_server(url: str, api_key: str | None, timeout: float) -> str | None:
    """The engine label for a bare --url: the first model id of its /v1/models, shortened.

    llama.cpp answers with the model file's path or alias; the label keeps the file name
    without `.gguf`, so it reads like an engine name in reports. None when nothing answers.
    """
    model = server_model(url, api_key, timeout)
    return (model_label(model) or None) if model else None


def resolve_targets(args: argparse.Namespace, config: Config | None) -> list[Target]:
    """Load targets (run, sweep) from --engine (config) or --url; UsageError when none fits."""
    engines = engines_from_config(args, config)
    if engines:
        return [Target(e.name, e.url, e.kind, e.api_key(), args.model) for e in engines]
    key = api_key(args)
    urls, names = listed(args.url), listed(args.name)
    if len(names) > len(urls):
        raise UsageError(f"--name is given {len(names)} times for {len(urls)} --url")
    targets: list[Target] = []
    for url, name in itertools.zip_longest(urls, names):
        label = name or label_from_server(url, key, args.connect_timeout) or "target"
        if any(t.name == label for t in targets):  # two servers of one model
            label = f"{label}-{len(targets) + 1}"
        targets.append(Target(label, url, args.kind, key, args.model))
    return targets
