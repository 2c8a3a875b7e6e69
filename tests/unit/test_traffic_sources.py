"""`--traffic` sources: the example traces, the generated sources, the grammar's errors, and
the parsers fuzzed (seeded from the example trace's lines): a clear TrafficError or a
traffic, never another exception."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen.prompts import CalibrationError
from loadgen.scheduler.calibration import traffic_prompts
from loadgen.traffic.model import MOONCAKE_BLOCK_TOKENS, Traffic, TrafficError, TrafficRequest
from loadgen.traffic.prompts import WORDS, TrafficPrompts, block_words
from loadgen.traffic.spec import load_traffic
from loadgen.traffic.traces import read_azure, read_mooncake
from tests.paths import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "traffic"
MOONCAKE = FIXTURES / "example-mooncake.jsonl"
AZURE = FIXTURES / "example-azure.csv"
LINES = MOONCAKE.read_text().splitlines()


def test_the_example_mooncake_trace() -> None:
    traffic = load_traffic(str(MOONCAKE))
    rows = [json.loads(line) for line in LINES]
    assert len(traffic.requests) == len(rows) == 26
    start = rows[0]["timestamp"]
    for req, row in zip(traffic.requests, rows, strict=True):
        assert req.at_s == pytest.approx((row["timestamp"] - start) / 1000)
        assert (req.prompt_tokens, req.output_tokens) == (row["input_length"], row["output_length"])
        assert sum(n for _, n in req.blocks) == req.prompt_tokens
        # The trace's ids first, 512 tokens each but the last.
        assert [b for b, _ in req.blocks[: len(row["hash_ids"])]] == row["hash_ids"]
        assert all(n == MOONCAKE_BLOCK_TOKENS for _, n in req.blocks[:-1])
    assert {k: len(v) for k, v in traffic.sessions().items()} == {"a": 3, "b": 3}
    turns = [traffic.requests[i] for i in traffic.sessions()["b"]]
    assert [t.turn for t in turns] == [0, 1, 2] and [t.think_s for t in turns] == [0, 0.5, 0.5]
    share = traffic.describe()["shared_prefix_share"]
    assert isinstance(share, float) and 0.2 < share < 0.6


def test_the_example_azure_trace() -> None:
    traffic = load_traffic(str(AZURE))
    assert [r.prompt_tokens for r in traffic.requests] == [374, 396, 879, 91, 1620, 220]
    assert [r.output_tokens for r in traffic.requests] == [44, 109, 55, 16, 32, 128]
    assert traffic.requests[1].at_s == pytest.approx(0.22441)
    assert traffic.requests[-1].at_s == pytest.approx(1.75941)
    assert traffic.shared_prefix_share() == 0


def test_equal_blocks_are_equal_text_and_others_differ() -> None:
    traffic = load_traffic(str(MOONCAKE))
    prompts = TrafficPrompts(traffic, overhead=10)
    by_first = {}
    for i, req in enumerate(traffic.requests):
        text = prompts.text(i)
        assert len(text.split()) == req.prompt_tokens - 10
        by_first.setdefault(req.blocks[0], []).append(text)
    shared = by_first[(0, 512)]
    assert len(shared) > 1 and len({t.split()[:502].__str__() for t in shared}) == 1
    assert block_words(0, 512)[:40] != block_words(10, 512)[:40]
    assert block_words(7, 100) == block_words(7, 512)[:100]


def test_a_mix_is_deterministic_and_has_its_rate() -> None:
    spec = "mix:prompt=lognormal:512:0.6,output=uniform:16:64,rate=4,seed=3,n=400"
    one, two = load_traffic(spec), load_traffic(spec)
    assert one == two and len(one.requests) == 400 and one.scheduled
    assert one.describe()["rate_per_s"] == pytest.approx(4, rel=0.15)
    # As replayed at --time-scale 0.25: four times the rate over a quarter of the span (it
    # said the trace's own figures whatever the scale).
    fast, plain = one.describe(0.25), one.describe()
    assert fast["time_scale"] == 0.25 and plain["time_scale"] == 1.0
    assert fast["rate_per_s"] == pytest.approx(4 * plain["rate_per_s"])  # type: ignore[operator]
    assert fast["span_s"] == pytest.approx(plain["span_s"] / 4)  # type: ignore[operator]
    lengths = sorted(r.prompt_tokens for r in one.requests)
    assert lengths[200] == pytest.approx(512, rel=0.1)
    assert load_traffic(spec.replace("seed=3", "seed=4")) != one


def test_a_mix_without_rate_is_a_closed_loop_of_requests_count() -> None:
    traffic = load_traffic("mix:prompt=fixed:100,output=fixed:8,concurrency=3", requests=5)
    assert not traffic.scheduled and traffic.concurrency == 3 and len(traffic.requests) == 5


def test_a_mix_file(tmp_path: Path) -> None:
    path = tmp_path / "served.json"
    path.write_text(
        json.dumps(
            {
                "kind": "llmb-length-mix",
                "version": 1,
                "prompt_tokens": {"empirical": [[128, 1], [1024, 1]]},
                "output_tokens": {"fixed": 32},
                "rate_per_second": 2.0,
                "concurrency": None,
                "seed": 1,
                "requests": 20,
                "source": "test",
            }
        )
    )
    traffic = load_traffic(str(path))
    assert len(traffic.requests) == 20 and all(
        1 <= r.prompt_tokens <= 1024 for r in traffic.requests
    )


def test_shared_prefix_groups() -> None:
    traffic = load_traffic("shared-prefix:groups=3,prompts=4,system=200,question=20,output=8")
    assert len(traffic.requests) == 12 and not traffic.scheduled
    firsts = [r.blocks[0] for r in traffic.requests]
    assert len(set(firsts)) == 3 and all(n == 200 for _, n in firsts)
    # 9 of the 12 system prompts were sent before.
    assert traffic.shared_prefix_share() == pytest.approx(9 * 200 / (12 * 220))


def test_sessions_carry_their_history() -> None:
    traffic = load_traffic("sessions:sessions=2,turns=3,question=50,output=10,think=1.5,rate=1")
    turns = [traffic.requests[i] for i in traffic.sessions()["s1"]]
    assert [t.prompt_tokens for t in turns] == [50, 110, 170]
    assert turns[2].blocks[: len(turns[1].blocks)] == turns[1].blocks
    assert [t.think_s for t in turns] == [0, 1.5, 1.5]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("mix:prompt=fixed:10", "output= is required"),
        (
            "mix:prompt=fixed:10,output=fixed:0",
            "output: 'fixed:0': Input should be greater than or equal to 1$",
        ),
        # The distribution's own reason, not pydantic's link to its docs.
        ("mix:prompt=uniform:300:100,output=fixed:1,n=2", "need 1 <= lo <= hi <= 1048576$"),
        ("mix:prompt=lognormal:100:-1,output=fixed:1,n=2", "lognormal: the spread must be >= 0"),
        (
            "mix:prompt=empirical:100=1/50=2,output=fixed:1,n=2",
            "upper bound 50.0 must be above 100.0",
        ),
        ("mix:prompt=gamma:1:2,output=fixed:1,n=2", "not a length distribution"),
        ("mix:prompt=fixed:10,output=fixed:1,rate=2,concurrency=2,n=2", "not both"),
        ("mix:prompt=fixed:10,output=fixed:1,speed=2", "unknown key 'speed'"),
        ("mix:prompt=fixed:10,output=fixed:1", "no request count"),
        ("mix:prompt=fixed:10,output=fixed:1,rate=-1,n=2", "rate must be above 0"),
        ("shared-prefix:groups=2,prompts=2,system=10,question=0,output=1", "question must be"),
        ("sessions:sessions=1,turns=2,question=5,output=5,think=-1", "think must be"),
        ("trace.txt", "unknown file type '.txt'"),
        ("missing.jsonl", "cannot read it"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec: str, words: str) -> None:
    with pytest.raises(TrafficError, match=words.replace("(", r"\(")):
        load_traffic(spec)


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('{"timestamp": 0, "output_length": 5}', "line 2: input_length: missing"),
        (
            '{"timestamp": 0, "input_length": 0, "output_length": 5}',
            "line 2: input_length: a whole",
        ),
        ('{"timestamp": -1, "input_length": 9, "output_length": 5}', "line 2: timestamp"),
        (
            '{"input_length": 9, "output_length": 5, "hash_ids": [1, 2]}',
            "line 2: hash_ids: 2 blocks",
        ),
        ('{"input_length": 9, "output_length": 5, "hash_ids": ["x"]}', "line 2: hash_ids: a list"),
        ('{"input_length": 9, "output_length": 5, "colour": 1}', "line 2: unknown field 'colour'"),
        ("[1, 2]", "line 2: not a JSON object"),
        ("{oops", "line 2: not JSON"),
    ],
)
def test_a_bad_mooncake_line_is_named(line: str, words: str) -> None:
    with pytest.raises(TrafficError, match=f"t.jsonl {words}".replace("[", r"\[")):
        read_mooncake(LINES[0] + "\n" + line + "\n", "t.jsonl")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "line 1: no header"),
        ("TIMESTAMP,ContextTokens\n1,2\n", "missing column GeneratedTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,x,3\n", "line 2: ContextTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,2,3\n", "line 2: TIMESTAMP"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,2\n", "line 2: 2 fields"),
    ],
)
def test_a_bad_azure_row_is_named(text: str, words: str) -> None:
    with pytest.raises(TrafficError, match=words):
        read_azure(text, "a.csv")


def _check(read: object, text: str) -> None:
    try:
        traffic = read(text, "fuzz")  # type: ignore[operator]
    except TrafficError as exc:
        assert str(exc).startswith("fuzz")
        return
    assert isinstance(traffic, Traffic)
    for req in traffic.requests:
        assert sum(n for _, n in req.blocks) == req.prompt_tokens >= 1 and req.at_s >= 0


_SEED_LINES = st.sampled_from(LINES)
_MUTATED = st.builds(
    lambda line, cut, junk: line[:cut] + junk + line[cut:],
    _SEED_LINES,
    st.integers(0, 120),
    st.text(max_size=6),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_SEED_LINES, _MUTATED), min_size=0, max_size=6))
def test_fuzz_mooncake(lines: list[str]) -> None:
    _check(read_mooncake, "\n".join(lines))


_AZURE_ROWS = AZURE.read_text().splitlines()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.builds(
            lambda row, cut, junk: row[:cut] + junk + row[cut:],
            st.sampled_from(_AZURE_ROWS),
            st.integers(0, 60),
            st.text(max_size=5),
        ),
        max_size=5,
    )
)
def test_fuzz_azure(rows: list[str]) -> None:
    _check(read_azure, "\n".join(rows))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_fuzz_the_grammar(body: str) -> None:
    for kind in ("mix:", "shared-prefix:", "sessions:"):
        try:
            load_traffic(kind + body, requests=3)
        except TrafficError:
            pass


async def test_the_overhead_and_the_words_are_counted(caplog: pytest.LogCaptureFixture) -> None:
    traffic = load_traffic(str(MOONCAKE))
    counted: list[str] = []

    async def template_of_seven(text: str) -> int:
        counted.append(text)
        return len(text.split()) + 7

    prompts = await traffic_prompts(traffic, template_of_seven)
    assert prompts.overhead == 7 and len(counted) == 2
    for i, req in enumerate(traffic.requests):
        assert await template_of_seven(prompts.text(i)) == req.prompt_tokens
    assert "not one token each" not in caplog.text

    # A tokenizer where some words are two tokens: the prompts keep to the others.
    long_words = {w for w in WORDS if len(w) > 5}

    async def some_words_two(text: str) -> int:
        return sum(2 if w in long_words else 1 for w in text.split()) + 3

    prompts = await traffic_prompts(traffic, some_words_two)
    assert set(prompts.vocab) == set(WORDS) - long_words and prompts.overhead == 3
    for i, req in enumerate(traffic.requests):
        assert await some_words_two(prompts.text(i)) == req.prompt_tokens
    assert "not one token each" not in caplog.text

    async def two_per_word(text: str) -> int:
        return 2 * len(text.split()) + 3

    with pytest.raises(CalibrationError, match="only 0 of"):
        await traffic_prompts(traffic, two_per_word)


def test_a_later_turn_without_timestamp_follows_its_turn_before() -> None:
    """AIPerf's multi-turn form: later turns carry `delay` only. They follow their first turn
    (sent `delay` after its answer), the schedule starts at the first first turn (5 s), and
    `--requests` keeps whole leading turns of a session."""
    rows = [
        {"session_id": "a", "timestamp": 5000, "input_length": 300, "output_length": 8,
         "hash_ids": [1]},
        {"session_id": "a", "delay": 500, "input_length": 812, "output_length": 8,
         "hash_ids": [1, 2]},
        {"session_id": "b", "timestamp": 9000, "input_length": 300, "output_length": 8,
         "hash_ids": [7]},
        {"session_id": "b", "delay": 500, "input_length": 812, "output_length": 8,
         "hash_ids": [7, 8]},
        # A later turn whose timestamp is before its turn before's: not sent first either.
        {"session_id": "b", "timestamp": 1000, "input_length": 900, "output_length": 8,
         "hash_ids": [7, 8]},
        {"timestamp": 9500, "input_length": 100, "output_length": 8},
    ]  # fmt: skip
    traffic = read_mooncake("".join(json.dumps(r) + "\n" for r in rows), "t.jsonl")
    order = [(r.session, r.turn, r.at_s, r.think_s) for r in traffic.requests]
    assert order == [
        ("a", 0, 0.0, 0.0),
        ("a", 1, 0.0, 0.5),
        ("b", 0, 4.0, 0.0),
        ("b", 1, 4.0, 0.5),
        ("b", 2, 4.0, 0.0),
        (None, 0, 4.5, 0.0),
    ]
    assert [(r.session, r.turn) for r in traffic.head(3).requests] == [
        ("a", 0), ("a", 1), ("b", 0)
    ]  # fmt: skip


def test_the_head_never_keeps_a_turn_without_the_one_before() -> None:
    turn = TrafficRequest(0.0, 10, 2, ((1, 10),), "s", 1, 0.5)
    first = TrafficRequest(0.1, 5, 2, ((1, 5),), "s", 0)
    single = TrafficRequest(0.2, 5, 2, ((2, 5),))
    traffic = Traffic("t", (turn, first, single, dataclasses.replace(single, at_s=0.3)))
    assert traffic.head(2).requests == (first, single)
    assert traffic.head(None) is traffic


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("bom.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
         '{"timestamp": 250, "input_length": 12, "output_length": 6}\n'),
        ("bom.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,5\n0.25,12,6\n"),
    ],
)  # fmt: skip
def test_a_trace_saved_with_a_byte_order_mark(tmp_path: Path, name: str, text: str) -> None:
    """Excel (and Notepad) save UTF-8 with a BOM: the trace reads as without one."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8-sig")
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    traffic = load_traffic(str(path))
    got = [(r.at_s, r.prompt_tokens, r.output_tokens) for r in traffic.requests]
    assert got == [(0.0, 10, 5), (0.25, 12, 6)]
