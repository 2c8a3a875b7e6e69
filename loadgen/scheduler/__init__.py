"""Scheduling: closed loop (N requests in flight) or open loop (Poisson/constant arrivals).

`run_step` (step.py) runs one setting (`RunSpec`, spec.py) against every target in turn, with
the same prompts in the same order, and returns per-engine summaries plus the token
verification. `RunContext` (context.py) carries what lives for a whole run (output writer,
live metrics, progress, Ctrl-C flag, calibrated prompts), so `run`, `sweep`, `diagnose` and
`compare` share one code path. One engine's phase (phase.py) sends and times the requests and
settles their records in the gaps between reads; pacing.py keeps the garbage collector there.
"""
