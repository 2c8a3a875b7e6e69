"""The one target and config resolver of every subcommand (run, sweep, diagnose, compare).

`--config FILE` is loaded by `load_config_or_usage`; `--engine NAME` (with the config) or
`--url URL` is checked by `engines_from_config`, which owns the error messages. Each bare URL
is probed once (`probe_target`: its `/v1/models` and, where asked, its kind's info endpoint)
and named by `url_targets`; the probe is handed on, so nothing asks the server again.
`diagnose` builds on these (it may import `loadgen`; nothing in `loadgen` imports `diagnose`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from config.kinds import GENERIC, engine_kind, engines
from config.settings import Config, ConfigError, EngineConfig, load_config
from loadgen.client import StreamClient, model_id, probe_client
from loadgen.options import UsageError, listed
from loadgen.target import Target


@dataclass(frozen=True)
class TargetProbe:
    """What a target said before any load: its kind, `/v1/models` and its kind's info body.

    `kind` is the generic `openai` when it was asked and no registered info endpoint answered.
    """

    kind: str
    models: Any = None  # the /v1/models document (None: no JSON answer)
    info: dict[str, Any] = field(default_factory=dict)  # {}: not asked, or no answer
    # Why nothing answered at the URL at all (connection refused, timed out); None: it did.
    unreachable: str | None = None

    @property
    def model(self) -> str | None:
        """The first model id of `/v1/models`, None when it named none."""
        return model_id(self.models)


async def probe_target(client: StreamClient, kind: str, info: bool = True) -> TargetProbe:
    """One probe of a target over `client`: `/v1/models`, then (with `info`) the first of its
    kind's info endpoints that answers a JSON object; the generic kind is told by the first
    registered kind whose endpoint does. Network errors leave a part unknown (the client's
    `probe_json` catches them by type); anything else is a bug and propagates."""
    wait = client.connect_timeout  # --connect-timeout bounds each probe
    models, unreachable = await client.probe("/v1/models", wait)
    if unreachable is not None:
        return TargetProbe(kind, unreachable=unreachable)
    if not info:
        return TargetProbe(kind, models)
    rows = engines() if kind == GENERIC else (engine_kind(kind),)
    for row in rows:
        for path in row.info.paths:
            body = await client.probe_json(path, wait)
            if isinstance(body, dict):
                return TargetProbe(row.kind, models, body)
    return TargetProbe(kind, models)


def probe_url(url: str, api_key: str | None, kind: str, timeout: float, info: bool) -> TargetProbe:
    """`probe_target` of a bare URL over one client (the load generator's, as every later
    request, with the same Authorization header)."""

    async def ask() -> TargetProbe:
        async with probe_client(url, api_key, timeout) as client:
            return await probe_target(client, kind, info)

    return asyncio.run(ask())


@dataclass(frozen=True)
class UrlTarget:
    """One `--url` target: its label and its probe (None: not asked, --name given to run)."""

    name: str
    url: str
    probe: TargetProbe | None


def url_targets(
    args: argparse.Namespace,
    key: str | None,
    info: bool,
    label: Callable[[str | None, TargetProbe | None], str],
) -> list[UrlTarget]:
    """The `--url` targets in order, each probed once (always with `info`, else only when no
    `--name` names it) and labelled by `label(name, probe)`; two of one label are told apart
    by their position."""
    urls, names = listed(args.url), listed(args.name)
    if len(names) > len(urls):
        raise UsageError(f"--name is given {len(names)} times for {len(urls)} --url")
    out: list[UrlTarget] = []
    for url, name in itertools.zip_longest(urls, names):
        asked = info or not name
        probe = probe_url(url, key, args.kind, args.connect_timeout, info) if asked else None
        title = label(name, probe)
        if any(t.name == title for t in out):  # two servers of one model
            title = f"{title}-{len(out) + 1}"
        out.append(UrlTarget(title, url, probe))
    return out


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


def label_from_server(name: str | None, probe: TargetProbe | None) -> str:
    """The label of a bare --url for run and sweep: --name, else its first model id shortened.

    llama.cpp answers with the model file's path or alias; the label keeps the file name
    without `.gguf`, so it reads like an engine name in reports; "target" when none answers.
    """
    model = probe.model if probe is not None else None
    return name or (model_label(model) if model else "") or "target"


def resolve_targets(args: argparse.Namespace, config: Config | None) -> list[Target]:
    """Load targets (run, sweep) from --engine (config) or --url; UsageError when none fits."""
    configured = engines_from_config(args, config)
    if configured:
        return [Target(e.name, e.url, e.kind, e.api_key(), args.model) for e in configured]
    key = api_key(args)
    return [
        Target(t.name, t.url, args.kind, key, args.model)
        for t in url_targets(args, key, info=False, label=label_from_server)
    ]
