"""Mutators of real engine answers: structure-aware for JSON, the Prometheus text format and
llama.cpp's log, or raw bytes. tools/fuzz_collectors.py serves their output over HTTP; the
hypothesis tests (tests/unit/test_fuzz_collectors.py) feed it to the collectors in process.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

# Raw JSON texts substituted for placeholder strings after serialization.
_RAW_JSON = {
    "__1e400__": "1e400",
    "__-1e400__": "-1e400",
    "__nan__": "NaN",
    "__bigint__": "9" * 5000,
    "__deep_list__": "[" * 3000 + "]" * 3000,
    "__deep_obj__": '{"a":' * 3000 + "1" + "}" * 3000,
}
HOSTILE_JSON: list[Any] = [
    # Lone surrogates several times over: they used to fail the whole answer (HTTP 500).
    *(["\ud800", "a\udfffb", "\udc80x"] * 3),
    "x\x00y\n\x1b[31m",
    "big",
    "lots",
    "",
    "1,5",
    "é" * 300,
    "x" * 20_000,
    -1,
    0,
    -1e308,
    2**64,
    10**30,
    3.5,
    True,
    False,
    None,
    ["a"],
    [1, 2],
    [],
    {},
    {"x": {"y": [1]}},
    *_RAW_JSON,
]
HOSTILE_VALUES = [
    "NaN",
    "+Inf",
    "-Inf",
    "1e400",
    "-1",
    "abc",
    "1_0",
    "0x10",
    "",
    "1.5.5",
    "9" * 400,
    "infinity",
]
HOSTILE_LABELS = ["1,5", "", "+Inf", "abc", 'a"b', "a\\b", "\\n", "\x00", "é\u2028", "NaN"]


def json_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (keys and indexes) into a JSON document, the root included."""
    out = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out.extend(json_paths(value, (*prefix, key)))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            out.extend(json_paths(value, (*prefix, index)))
    return out


def set_at(doc: Any, path: tuple[Any, ...], value: Any, delete: bool = False) -> Any:
    """`doc` with the node at `path` set to `value` (or deleted from its parent), in place;
    the root's path gives `value` itself."""
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


# Keys the collectors read: half of the JSON mutations aim at one of them.
READ_KEYS = frozenset(
    {
        "build_info", "model_path", "model_alias", "model_ftype", "total_slots", "n_ctx",
        "default_generation_settings", "data", "id", "meta", "size", "n_params", "ftype",
        "is_processing", "n_prompt_tokens", "served_model_name", "max_running_requests",
        "internal_states", "effective_max_running_requests_per_dp", "cpu_offload_gb",
        "kv_cache_dtype", "quantization", "dtype", "version", "simulated", "tp_size",
        "max_total_num_tokens", "page_size", "max_model_len",
    }
)  # fmt: skip


# Keys whose strings end up as label values (model, version, quantization).
LABEL_KEYS = frozenset(
    {"id", "build_info", "model_path", "model_alias", "model_ftype", "ftype",
     "served_model_name", "version", "quantization", "dtype", "kv_cache_dtype"}
)  # fmt: skip


def mutate_json(text: str, rng: random.Random) -> str:
    """One structural change to a JSON document: a hostile value, a deletion or a new type."""
    doc = json.loads(text)
    paths = json_paths(doc)
    read = [p for p in paths if p and p[-1] in READ_KEYS]
    path = rng.choice(read if read and rng.random() < 0.5 else paths)
    action = rng.random()
    if path and path[-1] in LABEL_KEYS and action < 0.35:
        # A string that becomes a label: the characters that used to fail the whole answer.
        doc = set_at(doc, path, rng.choice(["\ud800", "m\udfff", "a\x00b", "x\ny", "\x1b[1m"]))
    elif action < 0.7:
        doc = set_at(doc, path, rng.choice(HOSTILE_JSON))
    elif action < 0.85 and path:
        doc = set_at(doc, path, None, delete=True)
    else:
        doc = set_at(doc, path, rng.choice([[1, 2], "text", 7, {"data": "x"}]))
    out = json.dumps(doc)
    for placeholder, raw in _RAW_JSON.items():
        out = out.replace(json.dumps(placeholder), raw)
    return out


_MAPPED = re.compile(
    r"^(?:llamacpp:|sglang:(?:num_running_reqs|num_queue_reqs|token_usage|max_total_num_tokens|"
    r"context_len|kv_used_tokens|num_used_tokens|time_to_first_token|inter_token_latency|"
    r"queue_time|e2e_request|prompt_tokens_total|generation_tokens_total|cached_tokens|"
    r"weight_memory|kv_cache_memory|startup_time|num_requests_total|num_retracted))"
)


def _sample_lines(lines: list[str]) -> list[int]:
    return [i for i, line in enumerate(lines) if line and not line.startswith("#")]


def mutate_exposition(text: str, rng: random.Random) -> str:
    """One change to a text exposition: a value, a label, a line (lost, doubled, cut...)."""
    lines = text.split("\n")
    samples = _sample_lines(lines)
    if not samples:
        return text + "\n" + rng.choice(["garbage", "x 1", "{}"])
    # Half the time a line of a family the collectors map (SGLang exposes ~100 they skip).
    mapped = [i for i in samples if _MAPPED.search(lines[i])]
    i = rng.choice(mapped if mapped and rng.random() < 0.5 else samples)
    line = lines[i]
    action = rng.randrange(9)
    if action == 0:  # hostile value
        head = line.rsplit(" ", 1)[0]
        lines[i] = f"{head} {rng.choice(HOSTILE_VALUES)}"
    elif action == 1 and "=" in line:  # hostile label value (incl. le)
        start = line.index('="') + 2
        end = line.index('"', start)
        value = rng.choice(HOSTILE_LABELS).replace("\\", "\\\\").replace('"', '\\"')
        lines[i] = line[:start] + value + line[end:]
    elif action == 2:
        del lines[i]
    elif action == 3:
        lines.insert(i, line)
    elif action == 4 and i + 1 < len(lines):
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
    elif action == 5:
        lines[i] = line[: rng.randrange(len(line) + 1)]
    elif action == 6:
        pos = rng.randrange(len(line) + 1)
        lines[i] = line[:pos] + rng.choice(['"', "{", "}", ",", " ", "=", "\\", "#"]) + line[pos:]
    elif action == 7:
        lines.insert(i, rng.choice(["garbage", "{}", "x{ 1", '{"a"} 1', "a b c d e"]))
    else:  # a whole family as non-finite values
        name = line.split("{", 1)[0].split(" ", 1)[0]
        value = rng.choice(["NaN", "+Inf"])
        lines = [
            (ln.rsplit(" ", 1)[0] + " " + value) if ln.startswith(name) else ln for ln in lines
        ]
    return "\n".join(lines)


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """Byte-level damage: cut, NUL/invalid UTF-8/surrogate bytes inserted, bytes flipped."""
    action = rng.randrange(4)
    pos = rng.randrange(len(data) + 1)
    if action == 0:
        return data[:pos]
    if action == 1:
        junk = rng.choice([b"\x00", b"\xff\xfe", b"\xed\xa0\x80", b"\xc3", b"\r", b"\x1b[0m"])
        return data[:pos] + junk + data[pos:]
    if action == 2 and data:
        flipped = bytearray(data)
        for _ in range(rng.randrange(1, 8)):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        return bytes(flipped)
    return data + data[: rng.randrange(len(data) + 1)]


def mutate_body(path: str, data: bytes, rng: random.Random) -> bytes:
    """A mutation of one engine answer, structure-aware two times in three."""
    for _ in range(rng.choice([1, 1, 2, 3])):
        if rng.random() < 0.33:
            data = mutate_bytes(data, rng)
            continue
        try:
            text = data.decode("utf-8")
            if path == "/metrics":
                data = mutate_exposition(text, rng).encode("utf-8", "surrogatepass")
            else:
                data = mutate_json(text, rng).encode("utf-8", "surrogatepass")
        except (ValueError, IndexError, RecursionError):
            data = mutate_bytes(data, rng)  # already broken: keep breaking bytes
    return data


def mutate_log(text: str, rng: random.Random) -> str:
    """A llama-server log with some lines damaged (numbers, JSON lines, binary)."""
    lines = text.split("\n")
    for _ in range(rng.randrange(1, 6)):
        i = rng.randrange(len(lines))
        choice = rng.randrange(4)
        if choice == 0:
            lines[i] = lines[i].replace("0", rng.choice(["9" * 50, ".", "1e400", "-"]))
        elif choice == 1:
            lines[i] = json.dumps({"msg": rng.choice([lines[i], ["x"], 5, None])})
        elif choice == 2:
            lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)] + "\x00\udcff"
        else:
            lines.insert(i, "{" * rng.randrange(1, 3000))
    return "\n".join(lines)
