"""The KV pool as the binding limit on SGLang, on the simulator: a small token pool (3000
tokens, `-c`), a running cap far above what it admits (`-np 64`) and long prompts. Requests
wait while at most two run and `token_usage` stays below 0.9: diagnose must say the pool
binds and name the pool's flags, not `--max-running-requests`."""

from __future__ import annotations

from pathlib import Path

from core.conditions import POOL_ACTION, evaluate
from core.signals import Signals
from diagnose.procedure import diagnose
from tests.system.test_diagnose_sim import options, sim_engine


async def test_small_pool_is_the_limit_not_the_running_cap(tmp_path: Path) -> None:
    engine, gpu = sim_engine(
        tmp_path, "healthy", "sglang", flags="-np 64 -c 3000 --context-length 2048"
    )
    opts = options(gpu, concurrency=[1, 8], prompt_tokens=1200, max_tokens=48)
    result, decision = await diagnose(engine, opts, tmp_path / "out")
    sig = Signals(**result.signals)
    verdict = evaluate(sig)
    assert decision.verdict == {"e": "kv_saturated"}, [s.answer for s in decision.steps]
    assert {"pool_held", "pool_reserved"} & set(verdict.evidence), verdict.evidence
    # Running stayed far below its cap of 64.
    assert sig.running_slots_ratio is not None and sig.running_slots_ratio < 0.1
    assert decision.action == POOL_ACTION
    assert "--mem-fraction-static" in decision.action and "--max-total-tokens" in decision.action
    assert "--max-running-requests" not in decision.action
