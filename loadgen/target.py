"""`Target`: one server to load (the engine label, its kind, where it listens).

Every subcommand's targets come from `loadgen.resolve`; the client (`loadgen.client`), the
scheduler and the summaries take them as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from config.kinds import GENERIC


@dataclass(frozen=True)
class Target:
    """One server to load: the engine label, its kind and where it listens."""

    name: str
    url: str
    kind: str = GENERIC  # a registered kind (config/kinds.py) or the generic openai
    api_key: str | None = None
    model: str | None = None
