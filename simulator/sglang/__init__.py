"""Simulated SGLang server: `server` (HTTP API), `metrics` (the `/metrics` state and renderer),
`spec` (each release's metric families), `payloads` (the JSON documents it answers)."""

from simulator.sglang.server import SglangSim

__all__ = ["SglangSim"]
