"""What became of a request: the error categories of a record and how an engine's error
text is told apart as "no KV cache / context left"."""

from __future__ import annotations

# Error categories (the `error` field of a request record and the `outcome` metric label).
TIMEOUT = "timeout"
CONNECT = "connect_error"
HTTP = "http_error"
MALFORMED = "malformed"
DISCONNECTED = "disconnected"
SERVER_ERROR = "server_error"
EARLY_STOP = "early_stop"
INTERRUPTED = "interrupted"
CANCELLED = "cancelled"  # in flight when its step stopped early: cancelled, not waited for
# The engine ran out of KV cache / context for this request (llama.cpp "Context size has been
# exceeded", a prompt beyond the slot's context; SGLang's context-length and KV-pool refusals).
KV_EXHAUSTED = "kv_exhausted"
# Every error category, in the order reports list them.
ERROR_KINDS = (
    KV_EXHAUSTED,
    EARLY_STOP,
    TIMEOUT,
    CONNECT,
    HTTP,
    SERVER_ERROR,
    MALFORMED,
    DISCONNECTED,
    INTERRUPTED,
    CANCELLED,
)

# Lower-case fragments of the engines' own messages that mean "no KV cache / context left".
# llama.cpp (tools/server): decode failure "Context size has been exceeded." sent to every
# active slot; a prompt longer than the slot's context is refused with type
# "exceed_context_size_error" ("request (N tokens) exceeds the available context size (M
# tokens), try increasing it"; with context shift: "input (N tokens) is larger than the max
# context size (M tokens). skipping"). In a stream the error is a `data: {"error": ...}`
# event (older builds: an `error:` field line).
# SGLang: "The input (N tokens) is longer than the model's context length (M tokens)." and
# requests larger than the KV pool ("... larger than the KV cache pool", simulator wording).
KV_EXHAUSTED_MARKERS = (
    "context size has been exceeded",
    "exceed_context_size_error",
    "exceeds the available context size",
    "is larger than the max context size",
    "longer than the model's context length",
    "larger than the kv cache pool",
)


def is_kv_exhausted(text: str | None) -> bool:
    """True when an engine's error text says the request ran out of KV cache / context."""
    if not text:
        return False
    low = text.lower()
    return any(marker in low for marker in KV_EXHAUSTED_MARKERS)
