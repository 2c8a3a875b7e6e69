"""A step's rounds under `--traffic` (compare's default is three): each round its own text
for the same block structure, so a later round is not served whole from the prefix cache an
earlier one filled, while the blocks shared within a round stay shared, token-exact."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from diagnose import load as diagnose_load
from diagnose.decision.model import Row
from diagnose.engine_run import EngineRun
from diagnose.steps.base import LoadStep
from loadgen.client import StreamClient
from loadgen.scheduler.calibration import prompts_for
from loadgen.scheduler.context import RunContext
from loadgen.scheduler.spec import RunSpec
from loadgen.target import Target
from loadgen.traffic.model import Traffic
from loadgen.traffic.prompts import TrafficPrompts
from loadgen.traffic.spec import load_traffic
from tests.paths import ROOT

MOONCAKE = ROOT / "tests" / "fixtures" / "traffic" / "example-mooncake.jsonl"
AZURE = ROOT / "tests" / "fixtures" / "traffic" / "example-azure.csv"


def texts(traffic: Traffic, overhead: int = 4) -> list[str]:
    prompts = TrafficPrompts(traffic, overhead)
    return [prompts.text(i) for i in range(len(traffic.requests))]


@pytest.mark.parametrize("source", [str(MOONCAKE), str(AZURE)])
def test_no_prompt_is_sent_again_in_a_later_round(source: str) -> None:
    traffic = load_traffic(source)
    rounds = [texts(traffic.for_round(r)) for r in range(3)]
    assert traffic.for_round(0) is traffic
    for one in range(3):
        for other in range(one + 1, 3):
            assert not set(rounds[one]) & set(rounds[other])
            # Not even the opening words in common (they are the first block's).
            assert not {tuple(t.split()[1:9]) for t in rounds[one]} & {
                tuple(t.split()[1:9]) for t in rounds[other]
            }
    # Token-exact as before: every prompt the same number of words in every round.
    assert [len(t.split()) for t in rounds[2]] == [len(t.split()) for t in rounds[0]]
    lengths = [(r.prompt_tokens, r.output_tokens, r.at_s) for r in traffic.requests]
    assert [
        (r.prompt_tokens, r.output_tokens, r.at_s) for r in traffic.for_round(2).requests
    ] == lengths


def test_blocks_shared_within_a_round_stay_shared() -> None:
    traffic = load_traffic(str(MOONCAKE))
    for r in range(3):
        salted = traffic.for_round(r)
        # The same block structure: the shared-prefix share of the round is the trace's.
        assert salted.shared_prefix_share() == traffic.shared_prefix_share() > 0.2
        prompts = TrafficPrompts(salted, overhead=10)
        by_first: dict[tuple[int, int], list[list[str]]] = {}
        for i, req in enumerate(salted.requests):
            by_first.setdefault(req.blocks[0], []).append(prompts.text(i).split()[:502])
        shared = [words for words in by_first.values() if len(words) > 1]
        assert shared and all(all(w == group[0] for w in group) for group in shared)


async def test_a_later_round_takes_the_calibration_without_probes(tmp_path: Path) -> None:
    traffic = load_traffic(str(AZURE))
    ctx = RunContext(None)
    spec = RunSpec(targets=[Target("e", "http://127.0.0.1:9", "llamacpp")], traffic=traffic)
    ctx.prompts[(None, "traffic", spec.endpoint)] = TrafficPrompts(traffic, 7, ("a", "b"))
    # A probe would need the client: there is none to ask.
    spec.traffic = traffic.for_round(1)
    prompts = await prompts_for(ctx, spec, cast(StreamClient, None))
    assert isinstance(prompts, TrafficPrompts)
    assert prompts.traffic is spec.traffic and (prompts.overhead, prompts.vocab) == (7, ("a", "b"))


async def test_each_round_of_a_step_replays_its_own_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """diagnose's rounds (`_run_rounds`) hand the scheduler round r's traffic."""
    traffic = load_traffic(str(AZURE))
    sent: list[Traffic | None] = []

    async def run_step(spec: RunSpec, ctx: Any, step: int = 0) -> Any:
        sent.append(spec.traffic)
        return SimpleNamespace(
            records={}, summaries=[], abort_reason=None, interrupted=False, aborted=False
        )

    monkeypatch.setattr(diagnose_load, "run_step", run_step)
    opts = SimpleNamespace(
        max_tokens=8, timeout=5.0, connect_timeout=1.0, time_scale=1.0, schedule=True,
        requests_per_slot=1,
    )  # fmt: skip
    run = SimpleNamespace(
        opts=opts,
        engine=SimpleNamespace(name="e", kind="llamacpp"),
        target=lambda: Target("e", "http://127.0.0.1:9", "llamacpp"),
        ctx=None,
        round_no=0,
    )
    load = LoadStep("concurrency", 4, 128, rounds=3, traffic=traffic)
    _, stopped = await diagnose_load._run_rounds(
        cast(EngineRun, run), Row("e", "concurrency", 4), load
    )
    assert stopped is None and len(sent) == 3
    assert [t.requests if t else None for t in sent] == [
        traffic.for_round(r).requests for r in range(3)
    ]
    assert len({texts(t)[0] for t in sent if t}) == 3
