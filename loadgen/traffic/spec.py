"""`--traffic SPEC`: one grammar for every traffic source (docs/loadgen.md, "Your traffic").

    PATH.jsonl                      a Mooncake trace
    PATH.csv                        an Azure-style trace
    PATH.json                       a length-mix file (`llmb-length-mix`)
    mix:prompt=D,output=D[,rate=R|,concurrency=C][,n=N][,seed=S]
    shared-prefix:groups=G,prompts=P,system=S,question=Q,output=O[,rate=R][,seed=S]
    sessions:sessions=N,turns=T,question=Q,output=O[,think=SECONDS][,rate=R][,seed=S]

A length distribution D is `fixed:N`, `uniform:LO:HI`, `normal:MEAN:SD`,
`lognormal:MEDIAN:SIGMA` (the median in tokens, sigma of the natural log; the mix file's
`lognormal` is [mu, sigma] with mu = ln(median)) or `empirical:B1=W1/B2=W2/...` (bucket upper
bounds and weights).

`--traffic-from PROMETHEUS_URL` (`served_traffic`) is the served mix (loadgen/served_mix.py)
replayed as a length mix: the same Traffic a `.json` mix file gives.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from loadgen.served_mix import TRAFFIC_FLAGS, ServedMixError, served_mix
from loadgen.traffic.mix import MAX_TOKENS, LengthDist, LengthMix, MixError
from loadgen.traffic.model import Traffic, TrafficError
from loadgen.traffic.synth import from_mix, sessions, shared_prefix
from loadgen.traffic.traces import read_azure, read_mooncake

_KINDS = ("mix", "shared-prefix", "sessions")
# Bounds of a generated source (a typo of n=1000000000 is an error, not a frozen machine).
MAX_REQUESTS = 1_000_000


def _number(text: str, where: str, convert: Callable[[str], Any] = int) -> Any:
    try:
        value = convert(text)
    except ValueError:
        raise TrafficError(f"{where}: not a number: {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise TrafficError(f"{where}: not a finite number: {text!r}")
    return value


def parse_dist(text: str, where: str) -> LengthDist:
    """`fixed:128`, `uniform:10:50`, `normal:500:50`, `lognormal:512:0.6`, `empirical:...`."""
    shape, _, rest = text.partition(":")
    parts = rest.split(":") if rest else []
    obj: dict[str, Any]
    if shape == "fixed" and len(parts) == 1:
        obj = {"fixed": _number(parts[0], where)}
    elif shape == "uniform" and len(parts) == 2:
        obj = {"uniform": [_number(p, where) for p in parts]}
    elif shape == "normal" and len(parts) == 2:
        obj = {"normal": [_number(p, where, float) for p in parts]}
    elif shape == "lognormal" and len(parts) == 2:
        median, sigma = (_number(p, where, float) for p in parts)
        if median < 1:
            raise TrafficError(f"{where}: lognormal median must be >= 1 token, got {median:g}")
        obj = {"lognormal": [math.log(median), sigma]}
    elif shape == "empirical" and len(parts) == 1:
        buckets = []
        for item in parts[0].split("/"):
            bound, _, weight = item.partition("=")
            buckets.append([_number(bound, where, float), _number(weight, where, float)])
        obj = {"empirical": buckets}
    else:
        raise TrafficError(
            f"{where}: {text!r} is not a length distribution (fixed:N, uniform:LO:HI, "
            "normal:MEAN:SD, lognormal:MEDIAN:SIGMA, empirical:BOUND=WEIGHT/...)"
        )
    try:
        return LengthDist.model_validate(obj)
    except ValidationError as exc:
        # pydantic's own words, not its text (whose last line is a link to its docs).
        why = "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in exc.errors())
        raise TrafficError(f"{where}: {text!r}: {why}") from None


def _fields(
    body: str, kind: str, allowed: tuple[str, ...], required: tuple[str, ...]
) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in body.split(",") if body else []:
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise TrafficError(f"--traffic {kind}: {item!r} is not KEY=VALUE")
        if key not in allowed:
            raise TrafficError(
                f"--traffic {kind}: unknown key {key!r} (known: {', '.join(allowed)})"
            )
        if key in out:
            raise TrafficError(f"--traffic {kind}: {key} given twice")
        out[key] = value
    missing = [k for k in required if k not in out]
    if missing:
        raise TrafficError(f"--traffic {kind}: {missing[0]}= is required")
    return out


def _positive(
    fields: dict[str, str], key: str, kind: str, convert: Callable[[str], Any] = int
) -> Any:
    value = _number(fields[key], f"--traffic {kind}: {key}", convert)
    if value <= 0:
        raise TrafficError(f"--traffic {kind}: {key} must be above 0, got {fields[key]}")
    return value


def _optional(fields: dict[str, str], key: str, kind: str, convert: Callable[[str], Any]) -> Any:
    return _positive(fields, key, kind, convert) if key in fields else None


def _mix(body: str, text: str, requests: int | None) -> Traffic:
    allowed = ("prompt", "output", "rate", "concurrency", "n", "seed")
    fields = _fields(body, "mix", allowed, ("prompt", "output"))
    if "rate" in fields and "concurrency" in fields:
        raise TrafficError("--traffic mix: rate= (open loop) or concurrency= (closed), not both")
    mix = LengthMix(
        prompt_tokens=parse_dist(fields["prompt"], "--traffic mix: prompt"),
        output_tokens=parse_dist(fields["output"], "--traffic mix: output"),
        rate_per_second=_optional(fields, "rate", "mix", float),
        concurrency=_optional(fields, "concurrency", "mix", int),
        requests=_optional(fields, "n", "mix", int),
        seed=_number(fields.get("seed", "1"), "--traffic mix: seed"),
        source=text,
    )
    return from_mix(mix, text, requests)


def _shared(body: str, text: str) -> Traffic:
    kind = "shared-prefix"
    need = ("groups", "prompts", "system", "question", "output")
    fields = _fields(body, kind, (*need, "rate", "seed"), need)
    sizes = {key: _positive(fields, key, kind) for key in need}
    if sizes["groups"] * sizes["prompts"] > MAX_REQUESTS:
        raise TrafficError(f"--traffic {kind}: more than {MAX_REQUESTS} requests")
    if sizes["system"] + sizes["question"] > MAX_TOKENS or sizes["output"] > MAX_TOKENS:
        raise TrafficError(f"--traffic {kind}: a prompt or an answer over {MAX_TOKENS} tokens")
    return shared_prefix(
        text,
        **sizes,
        rate=_optional(fields, "rate", kind, float),
        seed=_number(fields.get("seed", "1"), f"--traffic {kind}: seed"),
    )


def _sessions(body: str, text: str) -> Traffic:
    kind = "sessions"
    need = ("sessions", "turns", "question", "output")
    fields = _fields(body, kind, (*need, "think", "rate", "seed"), need)
    sizes = {key: _positive(fields, key, kind) for key in need}
    if sizes["sessions"] * sizes["turns"] > MAX_REQUESTS or sizes["turns"] > 500:
        raise TrafficError(f"--traffic {kind}: more than {MAX_REQUESTS} requests or 500 turns")
    if sizes["turns"] * (sizes["question"] + sizes["output"]) > MAX_TOKENS:
        raise TrafficError(f"--traffic {kind}: the last turn's prompt is over {MAX_TOKENS} tokens")
    think = _number(fields.get("think", "0"), f"--traffic {kind}: think", float)
    if think < 0:
        raise TrafficError(f"--traffic {kind}: think must be 0 or more seconds, got {think:g}")
    return sessions(
        text,
        count=sizes["sessions"],
        turns=sizes["turns"],
        question=sizes["question"],
        output=sizes["output"],
        think_s=think,
        rate=_optional(fields, "rate", kind, float),
        seed=_number(fields.get("seed", "1"), f"--traffic {kind}: seed"),
    )


def _from_file(path: Path, requests: int | None) -> Traffic:
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".csv", ".json"):
        raise TrafficError(
            f"--traffic {path}: unknown file type {suffix or '(none)'!r} (.jsonl Mooncake, "
            f".csv Azure, .json a length mix; or {', '.join(k + ':' for k in _KINDS)})"
        )
    try:
        # utf-8-sig: a file saved by Excel (or Notepad) opens with a byte-order mark.
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise TrafficError(f"--traffic {path}: cannot read it ({exc})") from None
    if suffix == ".jsonl":
        return read_mooncake(text, str(path))
    if suffix == ".csv":
        return read_azure(text, str(path))
    try:
        mix = LengthMix.from_json(text)
    except MixError as exc:
        raise TrafficError(f"--traffic {path}: {exc}") from None
    return from_mix(mix, str(path), requests)


def load_traffic(text: str, requests: int | None = None) -> Traffic:
    """The traffic of `--traffic TEXT` (`requests`: --requests, a mix's count when it has
    none); a TrafficError says what is wrong."""
    kind, sep, body = text.partition(":")
    if sep and kind in _KINDS:
        if kind == "mix":
            return _mix(body, text, requests)
        if kind == "shared-prefix":
            return _shared(body, text)
        return _sessions(body, text)
    return _from_file(Path(text), requests)


def served_traffic(
    prometheus_url: str, window: str, engine: str | None, requests: int | None = None
) -> Traffic:
    """The traffic of `--traffic-from URL --traffic-window W [--traffic-engine NAME]`: what
    the engine served over the window, drawn as a length mix at the served arrival rate
    (`requests`: --requests); a TrafficError says what is wrong."""
    try:
        served = served_mix(prometheus_url, window, engine, flags=TRAFFIC_FLAGS)
        mix = served.length_mix()
    except ServedMixError as exc:
        raise TrafficError(str(exc).removeprefix("served-mix: ")) from None
    name = f"served mix of {served.engine} over the last {served.window} ({prometheus_url})"
    return from_mix(mix, name, requests)
