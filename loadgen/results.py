"""Per-request records, the requests.jsonl writer and token verification."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO

import orjson

from core.stats import percentile
from loadgen.client import StreamResult, finish
from loadgen.outcomes import CANCELLED, EARLY_STOP, ERROR_KINDS, INTERRUPTED


def mean(values: Sequence[float]) -> float | None:
    """Arithmetic mean; None when empty."""
    return sum(values) / len(values) if values else None


@dataclass
class RequestRecord:
    """One line of requests.jsonl."""

    engine: str
    step: int
    index: int
    start_time: float  # unix seconds when the request was sent
    end_time: float
    ttft_s: float | None
    itl_mean_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    tpot_s: float | None
    e2e_s: float
    decode_tok_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    chunks: int
    finish_reason: str | None
    server_prompt_ms: float | None
    server_predicted_ms: float | None
    server_predicted_per_second: float | None
    server_cache_n: int | None
    server_prompt_n: int | None
    server_predicted_n: int | None
    error: str | None
    error_detail: str | None = None
    # --traffic only (left out of the line otherwise): the prompt length the traffic asked
    # for, and the send's lateness against its schedule in seconds (None: not scheduled).
    prompt_tokens_target: int | None = None
    send_error_s: float | None = None
    itls: list[float] = field(default_factory=list, repr=False)

    def to_json(self) -> str:
        """Serialize, the gaps last (`itls`: an SLO's `itl_pQ` pools them, as vLLM does)."""
        # Not dataclasses.asdict: it deep-copies the gap list, the costliest step per request.
        data = {name: getattr(self, name) for name in _JSON_FIELDS}
        for name in _TRAFFIC_FIELDS:
            if data[name] is None:
                del data[name]
        return orjson.dumps(data).decode()


_JSON_FIELDS = tuple(f.name for f in fields(RequestRecord))
_TRAFFIC_FIELDS = ("prompt_tokens_target", "send_error_s")
# --traffic: a prompt this many tokens off the asked length is still the traffic's (a chat
# template can merge one token with the text), but reported; more makes the step invalid.
PROMPT_TOKENS_TOLERANCE = 1


def timed_record(
    engine: str,
    index: int,
    start: float,
    ttft: float,
    e2e: float,
    tokens: int,
    *,
    error: str | None = None,
    prompt_tokens: int = 32,
) -> RequestRecord:
    """A request whose times are given, not measured (diagnose/switch_noise.py's simulation,
    tests): sent at `start`, its first token `ttft` later, ended `e2e` after the send with
    `tokens` tokens evenly spaced from the first to the end. A failed one (`error`) streamed
    none. It goes through `build_record`, so its figures follow the measured ones' arithmetic;
    the server reported no timings."""
    stream = StreamResult(t_send=start, t_end=start + e2e, error=error, done=error is None)
    if stream.done:
        gap = (e2e - ttft) / (tokens - 1) if tokens > 1 else 0.0
        stream.chunk_times = [start + ttft + k * gap for k in range(tokens)]
        details = {"cached_tokens": 0}
        stream.usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens,
                        "prompt_tokens_details": details}  # fmt: skip
        stream.finish_reason = "length"
    return build_record(
        stream, engine=engine, step=0, index=index, max_tokens=tokens, wall_offset=0.0
    )


def build_record(
    result: StreamResult,
    *,
    engine: str,
    step: int,
    index: int,
    max_tokens: int,
    wall_offset: float,
    prompt_tokens_target: int | None = None,
    scheduled: float | None = None,
) -> RequestRecord:
    """Turn a raw StreamResult into a record; flags `early_stop` when the length is short.

    `wall_offset` converts perf_counter stamps to unix time (time.time() - perf_counter()).
    A result streamed with `parse=False` is parsed here first. `scheduled` (perf_counter)
    is when a replay meant to send it: the record keeps how late it went out.
    """
    finish(result)
    times = result.chunk_times
    usage = result.usage or {}
    timings = result.timings or {}
    details = usage.get("prompt_tokens_details") or {}
    prompt_tokens = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None and "cache_n" in timings:
        cached = timings.get("cache_n")
    ttft = times[0] - result.t_send if times else None
    itls = [b - a for a, b in itertools.pairwise(times)]
    e2e = result.t_end - result.t_send
    tpot = None
    decode = None
    if ttft is not None and isinstance(completion, int) and completion > 1:
        tpot = (result.t_end - times[0]) / (completion - 1)
        span = times[-1] - times[0]
        # Same definition as llama.cpp's predicted_per_second: the first token comes from the
        # prompt pass, so n-1 tokens are decoded between the first and the last token.
        decode = (completion - 1) / span if span > 0 else None
    error = result.error
    detail = result.error_detail
    if error is None and completion != max_tokens:
        error = EARLY_STOP
        detail = f"{completion} of {max_tokens} tokens (finish_reason={result.finish_reason})"
    return RequestRecord(
        engine=engine,
        step=step,
        index=index,
        start_time=result.t_send + wall_offset,
        end_time=result.t_end + wall_offset,
        ttft_s=ttft,
        itl_mean_s=mean(itls),
        itl_p50_s=percentile(itls, 50),
        itl_p99_s=percentile(itls, 99),
        tpot_s=tpot,
        e2e_s=e2e,
        decode_tok_s=decode,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion,
        cached_tokens=cached,
        chunks=len(times),
        finish_reason=result.finish_reason,
        server_prompt_ms=timings.get("prompt_ms"),
        server_predicted_ms=timings.get("predicted_ms"),
        server_predicted_per_second=timings.get("predicted_per_second"),
        server_cache_n=timings.get("cache_n"),
        server_prompt_n=timings.get("prompt_n"),
        server_predicted_n=timings.get("predicted_n"),
        error=error,
        error_detail=detail,
        prompt_tokens_target=prompt_tokens_target,
        send_error_s=None if scheduled is None else result.t_send - scheduled,
        itls=itls,
    )


class JsonlWriter:
    """Appends one JSON line per request, flushed with its batch (nothing lost on Ctrl-C)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh: IO[str] | None = path.open("a", encoding="utf-8")

    def write(self, record: RequestRecord) -> None:
        """Write and flush one record."""
        self.write_many((record,))

    def write_many(self, records: Sequence[RequestRecord]) -> None:
        """Write several records with one flush (one system call for a batch)."""
        if self._fh is not None and records:
            self._fh.write("".join([record.to_json() + "\n" for record in records]))
            self._fh.flush()

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def failure_reasons(by_engine: Mapping[str, Sequence[RequestRecord]]) -> list[str]:
    """Why a step is invalid because requests failed (one reason per engine with failures).

    `early_stop` is left to `verify_tokens` (it is a token-count problem), and `interrupted`
    and `cancelled` to the run's own interrupted/aborted state.
    """
    reasons: list[str] = []
    for engine, recs in by_engine.items():
        counts: dict[str, int] = {}
        for r in recs:
            if r.error is not None and r.error not in (EARLY_STOP, INTERRUPTED, CANCELLED):
                counts[r.error] = counts.get(r.error, 0) + 1
        if not counts:
            continue
        order = {kind: i for i, kind in enumerate(ERROR_KINDS)}
        kinds = ", ".join(
            f"{kind} {n}" for kind, n in sorted(counts.items(), key=lambda kv: order.get(kv[0], 99))
        )
        reasons.append(f"{engine}: {sum(counts.values())} of {len(recs)} requests failed ({kinds})")
    return reasons


def step_reasons(by_engine: Mapping[str, Sequence[RequestRecord]], max_tokens: int) -> list[str]:
    """Every reason a step is invalid: failed requests, then the token verification."""
    return failure_reasons(by_engine) + verify_tokens(by_engine, max_tokens)


def verify_tokens(by_engine: Mapping[str, Sequence[RequestRecord]], max_tokens: int) -> list[str]:
    """Reasons why this step's token counts do not prove the engines did the same work.

    Requests are matched by index (every engine got the same prompts in the same order).
    Empty list: valid.
    """
    reasons: list[str] = []
    for engine, recs in by_engine.items():
        traffic = any(r.prompt_tokens_target is not None for r in recs)
        short = [r for r in recs if r.error == EARLY_STOP]
        if short:
            counts = sorted({r.completion_tokens for r in short if r.completion_tokens is not None})
            asked = "the traffic's output lengths" if traffic else f"max_tokens {max_tokens}"
            reasons.append(
                f"{engine}: {len(short)} requests stopped early "
                f"(completion_tokens {counts} != {asked})"
            )
        if traffic:
            reasons.extend(_prompt_targets(engine, recs))
            continue
        prompts = {r.prompt_tokens for r in recs if r.prompt_tokens is not None}
        if len(prompts) > 1:
            reasons.append(f"{engine}: prompt_tokens differ between requests: {sorted(prompts)}")
    if len(by_engine) > 1:
        tables = {
            engine: {
                r.index: (r.prompt_tokens, r.completion_tokens)
                for r in recs
                if r.prompt_tokens is not None
            }
            for engine, recs in by_engine.items()
        }
        names = list(tables)
        first = names[0]
        for other in names[1:]:
            common = sorted(set(tables[first]) & set(tables[other]))
            bad = [i for i in common if tables[first][i] != tables[other][i]]
            if bad:
                i = bad[0]
                reasons.append(
                    f"{first} vs {other}: token counts differ on {len(bad)} of {len(common)} "
                    f"requests (e.g. request {i}: prompt/completion {tables[first][i]} vs "
                    f"{tables[other][i]})"
                )
            elif not common:
                reasons.append(f"{first} vs {other}: no request completed on both engines")
    return reasons


def prompt_tokens_off(record: RequestRecord) -> int | None:
    """--traffic: the engine's prompt tokens less the traffic's (None: not known)."""
    if record.prompt_tokens is None or record.prompt_tokens_target is None:
        return None
    return record.prompt_tokens - record.prompt_tokens_target


def _prompt_targets(engine: str, recs: Sequence[RequestRecord]) -> list[str]:
    """The requests whose prompt is further than the tolerance from the traffic's length."""
    off = [(r, d) for r in recs if (d := prompt_tokens_off(r)) is not None]
    bad = [(r, d) for r, d in off if abs(d) > PROMPT_TOKENS_TOLERANCE]
    if not bad:
        return []
    r, d = bad[0]
    return [
        f"{engine}: {len(bad)} of {len(off)} requests' prompt_tokens differ from the traffic's "
        f"by more than {PROMPT_TOKENS_TOLERANCE} (e.g. request {r.index}: {r.prompt_tokens} "
        f"for {r.prompt_tokens_target}, {d:+d})"
    ]
