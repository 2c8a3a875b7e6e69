"""Which GPU processes belong to which engine.

Engine collectors publish the pids they learn from the engine itself (e.g. the
SGLang scheduler pid carried by its `pid` label); the NVML collector asks
`engine_for` for every GPU process. Rules, in order:

1. a pid the engine reported, or `process.pid` from the config;
2. `process.cmdline_regex` from the config;
3. the default rule for the kind (`process` in config/kinds.py): a llama.cpp process
   whose command line runs `llama-server` with `--port <engine port>`; an SGLang process
   whose command line mentions `sglang` (and `--port <engine port>` when several SGLang
   engines exist). The port comes from the engine URL.
"""

from __future__ import annotations

import re
from collections import Counter
from urllib.parse import urlsplit

from config.kinds import engine_kind
from config.settings import EngineConfig


def _port(url: str) -> int | None:
    parts = urlsplit(url)
    if parts.port:
        return parts.port
    return {"http": 80, "https": 443}.get(parts.scheme)


def _has_port(cmdline: str, port: int | None) -> bool:
    if port is None:
        return False
    return re.search(rf"--port[ =]{port}\b", cmdline) is not None


class Attribution:
    """Maps GPU processes to configured engines."""

    def __init__(self, engines: list[EngineConfig]):
        self.engines = list(engines)
        self._reported: dict[str, set[int]] = {e.name: set() for e in engines}
        self._of_kind = Counter(e.kind for e in engines)

    def report_pids(self, engine: str, pids: set[int]) -> None:
        """Record the pids an engine told us about (replaces earlier ones)."""
        self._reported[engine] = set(pids)

    def engine_for(self, pid: int, cmdline: str) -> EngineConfig | None:
        """Return the engine a GPU process belongs to, or None."""
        for engine in self.engines:
            if pid in self._reported.get(engine.name, ()):
                return engine
            if engine.process and engine.process.pid == pid:
                return engine
        for engine in self.engines:
            if engine.process and engine.process.cmdline_regex:
                if re.search(engine.process.cmdline_regex, cmdline):
                    return engine
        for engine in self.engines:
            if engine.process and (engine.process.pid or engine.process.cmdline_regex):
                continue  # explicit rules only
            rule = engine_kind(engine.kind).process
            if rule.marker not in cmdline:
                continue
            if _has_port(cmdline, _port(engine.url)):
                return engine
            if rule.port == "when_several" and self._of_kind[engine.kind] == 1:
                return engine
        return None
