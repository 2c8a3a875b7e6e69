"""Single-request decode: per-sequence speed against the card's memory-bandwidth roofline."""

from __future__ import annotations

from diagnose.decision.model import NOT_MEASURED, Step
from diagnose.decision.prefill import prefill_text, split_text
from diagnose.decision.roofline import roofline, roofline_text
from diagnose.decision.sources import decode_text
from diagnose.engine_run import EngineRun, LoadStep
from diagnose.step_table import STEP_QUESTIONS


class SingleStep:
    """One request at a time; the roofline of the engine's model on its card."""

    key = "single"

    async def measure(self, run: EngineRun) -> Step:
        """The decode answer with its roofline figures (never flagged: the verdict decides)."""
        opts = run.opts
        with run.phase("single"):
            row = await run.load_row(LoadStep("single", 1, opts.prompt_tokens, opts.rounds))
        res = run.result
        res.roofline = roof = roofline(res)
        decode = decode_text(row)
        if row.error or decode is None:
            answer = f"failed: {row.error}" if row.error else NOT_MEASURED + "no decode timings"
        else:
            answer = decode
            if roof.limit_tok_s and roof.efficiency is not None:
                answer += roofline_text(roof)
            else:
                answer += "; roofline unknown: pass --bandwidth-gbs (no GPU bandwidth known)"
        if not row.error:
            answer += "; " + prefill_text(res.prefill) + split_text(row)
        run.say("single", answer)
        numbers: dict[str, object] = {
            "per_seq_tok_s": row.per_seq_tok_s,
            "per_seq_source": row.per_seq_source,
            "roofline_tok_s": roof.limit_tok_s,
            "efficiency": roof.efficiency,
            "bytes_per_step": roof.bytes_per_step,
            "active_weights_bytes": roof.active_weights_bytes,
            "accepted_tokens_per_step": roof.accepted_tokens_per_step,
            "misfit": roof.misfit,
            "rounds": row.per_seq_rounds,
            "prefill": res.prefill,
        }
        return Step("single", STEP_QUESTIONS["single"], answer, False, numbers)
