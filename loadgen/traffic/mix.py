"""A length mix: prompt and output length distributions, an arrival rate or a concurrency.

The file form (`llmb-length-mix`, version 1) is what `--traffic FILE.json` reads and what the
served-mix builder writes from Prometheus:

    {"kind": "llmb-length-mix", "version": 1,
     "prompt_tokens": {"lognormal": [6.2, 0.6]}, "output_tokens": {"fixed": 128},
     "rate_per_second": 4.0, "concurrency": null, "seed": 1, "requests": 200,
     "source": "free text"}

A distribution is one of `{"fixed": N}`, `{"uniform": [lo, hi]}`, `{"normal": [mean, sd]}`,
`{"lognormal": [mu, sigma]}` (of the natural log of the length) or
`{"empirical": [[upper_bound, weight], ...]}`: bucket upper bounds as a Prometheus histogram
gives them (strictly increasing, finite: leave the `+Inf` bucket out or fold it into the
last), each with the share of samples in that bucket (not cumulative); a length is drawn
uniformly between the previous bound (exclusive, 0 for the first) and this one. Lengths are
whole tokens, at least 1 and at most MAX_TOKENS. Unknown keys are rejected.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

KIND: Literal["llmb-length-mix"] = "llmb-length-mix"
VERSION: Literal[1] = 1
# Longer than any context we serve; a draw past it is clipped (a lognormal's tail).
MAX_TOKENS = 1 << 20
_SHAPES = ("fixed", "uniform", "normal", "lognormal", "empirical")


class MixError(ValueError):
    """A length mix that cannot be read or used; the message names the field."""


class LengthDist(BaseModel):
    """One length distribution: exactly one of its fields is set."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    fixed: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    uniform: tuple[int, int] | None = None
    normal: tuple[float, float] | None = None
    lognormal: tuple[float, float] | None = None
    empirical: tuple[tuple[float, float], ...] | None = None

    @model_validator(mode="after")
    def _one_shape(self) -> LengthDist:
        given = [name for name in _SHAPES if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"exactly one of {', '.join(_SHAPES)} (got {given or 'none'})")
        if self.uniform is not None:
            lo, hi = self.uniform
            if not 1 <= lo <= hi <= MAX_TOKENS:
                raise ValueError(f"uniform [{lo}, {hi}]: need 1 <= lo <= hi <= {MAX_TOKENS}")
        for name in ("normal", "lognormal"):
            pair = getattr(self, name)
            if pair is not None and pair[1] < 0:
                raise ValueError(f"{name}: the spread must be >= 0 (got {pair[1]})")
        if self.normal is not None and self.normal[0] < 1:
            raise ValueError(f"normal: the mean must be >= 1 token (got {self.normal[0]})")
        if self.lognormal is not None and self.lognormal[0] > math.log(MAX_TOKENS):
            raise ValueError(f"lognormal: mu {self.lognormal[0]} is past {MAX_TOKENS} tokens")
        if self.empirical is not None:
            _check_buckets(self.empirical)
        return self

    def shape(self) -> str:
        """The name of the distribution (`fixed`, `uniform`, ...)."""
        return next(name for name in _SHAPES if getattr(self, name) is not None)

    def sample(self, rng: random.Random) -> int:
        """One length in tokens, drawn with `rng`."""
        if self.fixed is not None:
            return self.fixed
        if self.uniform is not None:
            return rng.randint(*self.uniform)
        if self.normal is not None:
            return _clip(rng.gauss(*self.normal))
        if self.lognormal is not None:
            return _clip(rng.lognormvariate(*self.lognormal))
        assert self.empirical is not None
        bounds = [b for b, _ in self.empirical]
        (pick,) = rng.choices(range(len(bounds)), weights=[w for _, w in self.empirical])
        lo = math.floor(bounds[pick - 1]) + 1 if pick else 1
        hi = max(lo, math.floor(bounds[pick]))
        return rng.randint(lo, hi)

    def mean(self) -> float:
        """The mean length in tokens (before rounding and clipping)."""
        if self.fixed is not None:
            return float(self.fixed)
        if self.uniform is not None:
            return sum(self.uniform) / 2
        if self.normal is not None:
            return self.normal[0]
        if self.lognormal is not None:
            mu, sigma = self.lognormal
            return math.exp(mu + sigma * sigma / 2)
        assert self.empirical is not None
        total = sum(w for _, w in self.empirical)
        prev, acc = 0.0, 0.0
        for bound, weight in self.empirical:
            acc += weight * (prev + bound) / 2
            prev = bound
        return acc / total

    def to_obj(self) -> dict[str, Any]:
        """The JSON form: `{shape: value}`."""
        value = getattr(self, self.shape())
        if self.empirical is not None:
            value = [list(pair) for pair in self.empirical]
        elif isinstance(value, tuple):
            value = list(value)
        return {self.shape(): value}


def _check_buckets(buckets: tuple[tuple[float, float], ...]) -> None:
    if not buckets:
        raise ValueError("empirical: at least one [upper_bound, weight] bucket")
    prev = 0.0
    for i, (bound, weight) in enumerate(buckets):
        if bound <= prev or bound > MAX_TOKENS:
            raise ValueError(
                f"empirical bucket {i}: upper bound {bound} must be above {prev} and at most "
                f"{MAX_TOKENS} (strictly increasing, finite)"
            )
        if weight < 0:
            raise ValueError(f"empirical bucket {i}: weight {weight} is negative")
        prev = bound
    if sum(w for _, w in buckets) <= 0:
        raise ValueError("empirical: the weights sum to 0 (no sample to draw)")


def _clip(value: float) -> int:
    return min(MAX_TOKENS, max(1, round(value)))


class LengthMix(BaseModel):
    """A length mix (the `llmb-length-mix` file): what `--traffic FILE.json` replays."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Literal["llmb-length-mix"] = KIND
    version: Literal[1] = VERSION
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    # Open loop at this mean rate (Poisson arrivals); None: the run's --rate or --concurrency.
    rate_per_second: float | None = Field(default=None, gt=0)
    # Closed loop width (with --no-schedule, or when no rate); None: the run's --concurrency.
    concurrency: float | None = Field(default=None, gt=0)
    seed: int = 1
    # Requests to draw; None: the run's --requests.
    requests: int | None = Field(default=None, ge=1)
    source: str = ""

    @classmethod
    def from_json(cls, text: str | bytes) -> LengthMix:
        """Read a mix file's text; a MixError names the field that is wrong."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            raise MixError(_explain(exc)) from None

    def to_json(self) -> str:
        """The file's text (indented, every top-level key present)."""
        obj: dict[str, Any] = {
            "kind": self.kind,
            "version": self.version,
            "prompt_tokens": self.prompt_tokens.to_obj(),
            "output_tokens": self.output_tokens.to_obj(),
            "rate_per_second": self.rate_per_second,
            "concurrency": self.concurrency,
            "seed": self.seed,
            "requests": self.requests,
            "source": self.source,
        }
        return json.dumps(obj, indent=2) + "\n"


def _explain(exc: ValidationError) -> str:
    """One line per problem: `field.path: message`."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(file)"
        lines.append(f"{where}: {err['msg']}")
    return "; ".join(lines)
