"""The procedure's steps, in order, and the question each one answers.

Below the steps and the engine run, which both name them, so that neither imports the other.
"""

from __future__ import annotations

STEPS = ("residency", "single", "concurrency", "kv_pressure", "context")
STEP_QUESTIONS = {
    "residency": "Do the weights fit and stay resident on the GPU?",
    "single": "Single-request decode: how close to the card's limit?",
    "concurrency": "Concurrency: does aggregate throughput grow, do requests queue?",
    "kv_pressure": "KV pressure: do long prompts in every slot fit in the KV cache?",
    "context": "Long context: where does memory give out?",
}
