"""Simulated llama.cpp `llama-server`: `server` (HTTP API), `metrics` (`/metrics`), `logs` (its
log lines), `payloads` (the JSON documents it answers)."""

from simulator.llamacpp.metrics import fmt
from simulator.llamacpp.server import LlamaCppSim

__all__ = ["LlamaCppSim", "fmt"]
