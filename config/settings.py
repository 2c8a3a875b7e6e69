"""Typed configuration shared by the exporter and the load generator.

One YAML file describes the engines (by name) and the GPU sampling. Every
validation problem is collected and reported at once (`ConfigError.errors`),
unknown keys are rejected, and environment variables can override any key
(see `apply_env_overrides`) so the same file works inside a container.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from config.expand import expand_config
from config.kinds import kind_choice
from config.loadgen import LoadgenSettings  # pydantic alone: not the load generator itself

ENV_PREFIX = "LLMB__"
RESERVED_SOURCE_NAMES = {"nvml"}

# A day: larger is a typo, and asyncio's timers overflow long before 1e300.
MAX_SECONDS = 86400.0
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]
# Deeper YAML than this is not a config file (PyYAML would recurse until RecursionError).
MAX_YAML_DEPTH = 100

# `engines[].kind`: one of the registered kinds (config/kinds.py), checked when validated
# so a wrong kind is told the valid ones.
EngineKindName = Annotated[str, BeforeValidator(kind_choice)]


class ConfigError(Exception):
    """The configuration is invalid; `errors` lists every problem as 'location: message'."""

    def __init__(self, errors: list[str]):
        super().__init__("\n".join(errors))
        self.errors = errors


class _Strict(BaseModel):
    # allow_inf_nan=False: `1e400` is YAML for infinity, never a meant value.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ProcessMatch(_Strict):
    """How GPU processes are attributed to an engine when the engine does not report its pid.

    `pid` wins when given; otherwise a process belongs to the engine when its command
    line matches `cmdline_regex` (Python `re.search`).
    """

    pid: int | None = Field(default=None, gt=0)
    cmdline_regex: str | None = None

    @field_validator("cmdline_regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression: {exc}") from exc
        return value


class LaunchConfig(_Strict):
    """How `llmb-loadgen diagnose` may (re)start the engine with one variable changed."""

    command: str = Field(description="command template with {model} {ctx} {parallel} {ngl} ...")
    env: dict[str, str] = Field(default_factory=dict)
    ready_timeout_seconds: Seconds = 600.0
    settle_seconds: float = Field(default=30.0, ge=0)
    defaults: dict[str, str | int | float] = Field(default_factory=dict)


class EngineConfig(_Strict):
    """One inference server, scraped by the exporter and targeted by the load generator."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")
    kind: EngineKindName
    url: str
    api_key_env: str | None = Field(
        default=None, description="environment variable holding the API key (never logged)"
    )
    log_file: Path | None = None
    model_path: Path | None = None
    process: ProcessMatch | None = None
    timeout_seconds: Seconds | None = None
    max_response_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        le=1 << 30,
        description="largest engine answer read per request; bigger ones are errors (too_large)",
    )
    launch: LaunchConfig | None = None

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        check_http_url(value)
        return value.rstrip("/")

    def api_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """Return the API key from the environment, or None when none is configured."""
        if not self.api_key_env:
            return None
        return (environ if environ is not None else os.environ).get(self.api_key_env) or None


class GpuConfig(_Strict):
    """NVML sampling: which GPUs, how often, and overrides for what NVML cannot tell."""

    enabled: bool = True
    devices: list[int | str] | None = Field(
        default=None, description="GPU indexes or UUIDs to export; default all"
    )
    sample_interval_seconds: float = Field(default=0.1, gt=0, le=60)
    peak_window_seconds: float = Field(default=30.0, gt=0)
    bandwidth_bytes_per_second: float | dict[str, float] | None = Field(
        default=None,
        description="theoretical memory bandwidth override: one value, or per GPU index/UUID",
    )
    fake_file: list[Path] | None = Field(
        default=None,
        description="read NVML-shaped JSON files instead of the driver (tests, demo, simulators)",
    )

    @field_validator("fake_file", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        if isinstance(value, (str, Path)):
            return [value]
        return value

    @field_validator("bandwidth_bytes_per_second")
    @classmethod
    def _positive(cls, value: Any) -> Any:
        values = value.values() if isinstance(value, dict) else [value] if value else []
        if any(v <= 0 for v in values):
            raise ValueError("bandwidth must be positive")
        return value


class Config(_Strict):
    """The whole file."""

    host: str = Field(
        default_factory=socket.gethostname,
        min_length=1,
        description="`host` label on every series: tells machines apart on one Prometheus",
    )
    listen: str = "127.0.0.1:9490"
    scrape_timeout_seconds: Seconds = Field(
        default=10.0, description="deadline when Prometheus sends no timeout header"
    )
    source_timeout_seconds: Seconds = Field(default=5.0, description="default per-source timeout")
    min_interval: float = Field(
        default=0.0,
        ge=0,
        le=MAX_SECONDS,
        description="seconds: a /metrics request within this long of the last collection's "
        "start is answered from it (0: every request not coalesced with one in flight collects)",
    )
    host_memory_bandwidth_bytes_per_second: float | None = Field(
        default=None,
        gt=0,
        description="host memory bandwidth for the expert-offload bound (default: measured "
        "once at start, model/host_memory.py)",
    )
    engines: list[EngineConfig] = Field(default_factory=list)
    gpu: GpuConfig = Field(default_factory=GpuConfig)
    loadgen: LoadgenSettings = Field(
        default_factory=LoadgenSettings, description="load generator defaults (see loadgen docs)"
    )

    @field_validator("host", mode="before")
    @classmethod
    def _host_text(cls, value: Any) -> Any:
        # LLMB__HOST values are parsed as YAML, so a numeric host name arrives as a number.
        return (
            str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
        )

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("must be HOST:PORT with a port between 1 and 65535")
        if any(c.isspace() or not c.isprintable() for c in host):
            raise ValueError("the host must not contain spaces or control characters")
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> Config:
        seen: set[str] = set()
        for engine in self.engines:
            if engine.name in seen:
                raise ValueError(f"engine name {engine.name!r} is used twice")
            if engine.name in RESERVED_SOURCE_NAMES:
                raise ValueError(f"engine name {engine.name!r} is reserved")
            seen.add(engine.name)
        return self

    @property
    def listen_host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]") or "0.0.0.0"

    @property
    def listen_port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    def engine(self, name: str) -> EngineConfig:
        """Return the engine called `name` or raise KeyError naming the known ones."""
        for engine in self.engines:
            if engine.name == name:
                return engine
        known = ", ".join(e.name for e in self.engines) or "none"
        raise KeyError(f"no engine named {name!r} in the config (known: {known})")


def config_file_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The config file named in the environment: LLMB_CONFIG_FILE, as in compose's `.env`
    (LLMB_CONFIG, its former name, still read)."""
    env = os.environ if environ is None else environ
    return env.get("LLMB_CONFIG_FILE") or env.get("LLMB_CONFIG") or None


def check_http_url(value: str) -> None:
    """Raise ValueError unless `value` is an http(s) URL an HTTP client can request."""
    if any(c.isspace() or not c.isprintable() for c in value):
        raise ValueError("must not contain spaces or control characters")
    try:
        parts = urlsplit(value)
        port = parts.port  # ValueError when not a number or out of 0-65535
    except ValueError as exc:
        raise ValueError(f"not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    if port == 0:
        raise ValueError("port must be between 1 and 65535")
    if parts.query or parts.fragment:
        raise ValueError("must not have a query or fragment (paths are appended to it)")


def format_validation_errors(exc: ValidationError, data: Mapping[str, Any]) -> list[str]:
    """'location: message' lines of a pydantic error, engines named where possible."""
    errors = []
    for err in exc.errors():
        loc = list(err["loc"])
        # Show engines by name rather than list index where we can.
        if len(loc) >= 2 and loc[0] == "engines" and isinstance(loc[1], int):
            engines = data.get("engines")
            engines = engines if isinstance(engines, list) else []
            if loc[1] < len(engines) and isinstance(engines[loc[1]], dict):
                name = engines[loc[1]].get("name")
                if name:
                    loc[1] = f"{loc[1]}({name})"
        where = ".".join(str(p) for p in loc) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        elif err["type"] == "finite_number":
            msg = "must be a finite number"
        errors.append(f"{where}: {msg}")
    return errors


def apply_env_overrides(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Apply `LLMB__A__B=value` overrides (value parsed as YAML) to nested keys.

    Engines are addressed by name: `LLMB__ENGINES__LLAMA__URL=http://...`.
    Keys are case-insensitive.
    """
    for key, raw in sorted(environ.items()):
        if not key.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in key[len(ENV_PREFIX) :].split("__") if p]
        if not path:
            continue
        try:
            value = _load_yaml_text(raw) if raw != "" else ""
        except ConfigError as exc:
            raise ConfigError([f"environment {key}: {e}" for e in exc.errors]) from None
        if path[0] == "engines" and len(path) >= 3:
            engines = data.setdefault("engines", [])
            if not isinstance(engines, list):
                raise ConfigError([f"environment {key}: engines must be a list"])
            target = next(
                (
                    e
                    for e in engines
                    if isinstance(e, dict) and str(e.get("name", "")).lower() == path[1]
                ),
                None,
            )
            if target is None:
                target = {"name": path[1]}
                engines.append(target)
            node: dict[str, Any] = target
            rest = path[2:]
        else:
            node = data
            rest = path
        for part in rest[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[rest[-1]] = value
    return data


def parse_config(data: Any, environ: Mapping[str, str] | None = None) -> Config:
    """Validate a loaded mapping (plus environment overrides) into a Config."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(["(top level): must be a mapping of keys to values"])
    environ = os.environ if environ is None else environ
    if "host" not in data and environ.get("LLMB_HOST"):
        # LLMB_HOST, the name compose's `.env` uses; LLMB__HOST (an override) still wins.
        data = {**data, "host": environ["LLMB_HOST"]}
    data = apply_env_overrides(data, environ)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_errors(exc, data)) from None


def load_config(path: str | Path | None, environ: Mapping[str, str] | None = None) -> Config:
    """Read, expand `${VAR}` (config/expand.py), override from the environment and validate.

    With `path` None only defaults and environment overrides apply.
    """
    data: Any = {}
    if path is not None:
        data = read_yaml(path)
        if data is None:
            raise ConfigError(
                [f"{path}: the file is empty; give at least one key (see config.example.yaml)"]
            )
        data = expand_config(data, os.environ if environ is None else environ)
    return parse_config(data, environ)


def read_yaml(path: str | Path) -> Any:
    """Load a YAML file as UTF-8 (or UTF-16/32 with a byte order mark); ConfigError if not."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    text = _decode(raw, path)
    try:
        return _load_yaml_text(text)
    except ConfigError as exc:
        raise ConfigError([f"{path}: {e}" for e in exc.errors]) from None


def _decode(raw: bytes, path: str | Path) -> str:
    boms = (
        (b"\xff\xfe\x00\x00", "utf-32-le"),
        (b"\x00\x00\xfe\xff", "utf-32-be"),
        (b"\xff\xfe", "utf-16-le"),
        (b"\xfe\xff", "utf-16-be"),
        (b"\xef\xbb\xbf", "utf-8"),
    )
    encoding = next((enc for bom, enc in boms if raw.startswith(bom)), None)
    try:
        if encoding is not None:
            return raw.decode(encoding).lstrip("\ufeff")
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        what = encoding.upper() if encoding else "UTF-8"
        raise ConfigError(
            [f"{path}: not {what} text (byte {exc.start}); is this the right file?"]
        ) from None
    if "\x00" in text:
        raise ConfigError([f"{path}: a binary file, not a YAML text file"])
    return text


def _load_yaml_text(text: str) -> Any:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # The caller names the file (or variable); PyYAML's stand-in name for a string is noise.
        where = str(exc).replace('in "<unicode string>", ', "")
        raise ConfigError([f"not valid YAML: {where}"]) from None
    except RecursionError:
        raise ConfigError([f"nested deeper than {MAX_YAML_DEPTH} levels"]) from None
    if _depth(data) > MAX_YAML_DEPTH:
        raise ConfigError([f"nested deeper than {MAX_YAML_DEPTH} levels"])
    return data


def _depth(value: Any, level: int = 0, seen: set[int] | None = None) -> int:
    """Nesting depth, stopping once it passes MAX_YAML_DEPTH.

    YAML aliases share one object; each container is visited once so that a file of
    nested aliases ("billion laughs") costs its size, not its expansion.
    """
    if level > MAX_YAML_DEPTH:
        return level
    if isinstance(value, dict):
        children: Any = value.values()
    elif isinstance(value, list):
        children = value
    else:
        return level
    seen = set() if seen is None else seen
    if id(value) in seen:
        return level
    seen.add(id(value))
    return max((_depth(child, level + 1, seen) for child in children), default=level)
