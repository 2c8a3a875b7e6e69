"""`collect_facts` on its own: hand-made inputs in, a `CollectedFacts` value out.

The engine's probe is handed on (no server), the model file is a synthetic GGUF written here
(tools/synth_model); the value says what was found and writes nothing; the procedure takes
it into the engine's `Facts` (`with_collected`, a new value), the endpoints' facts first and
the GGUF's where they said nothing.
"""

from __future__ import annotations

from pathlib import Path

from config.settings import EngineConfig, parse_config
from diagnose.decision.model import Facts
from diagnose.facts import collect_facts, with_collected
from diagnose.options import Options
from loadgen.resolve import TargetProbe
from loadgen.target import Target
from model.geometry import geometry_from_gguf
from tools.synth_model.gguf_file import write_header_only
from tools.synth_model.plan import build_model

PROPS = {"total_slots": 4, "default_generation_settings": {"n_ctx": 2048}}
# Nothing listens here: a handed-on probe means the facts never ask the engine again.
NOWHERE = "http://127.0.0.1:9"


def _engine() -> EngineConfig:
    cfg = parse_config({"engines": [{"name": "g", "kind": "llamacpp", "url": NOWHERE}]}, environ={})
    return cfg.engines[0]


def _opts(model: str) -> Options:
    """The probe of a llama-server that serves `model` (its /props `model_path`)."""
    models = {"data": [{"id": "m", "meta": {"n_ctx_train": 32768}}]}
    return Options(probes={"g": TargetProbe("llamacpp", models, {**PROPS, "model_path": model})})


async def test_the_facts_of_the_gguf_the_endpoint_names(tmp_path: Path) -> None:
    path = tmp_path / "gemma3-27b-q4_0.gguf"
    write_header_only(build_model("gemma3-27b", "q4_0", None), path)
    geo = geometry_from_gguf(path)
    target = Target("g", NOWHERE, "llamacpp", None, None)
    facts = await collect_facts(_engine(), _opts(str(path)), target, None)
    assert facts.model_path == path and facts.geometry == geo
    assert facts.endpoints.slots == 4 and facts.endpoints.model_path == str(path)
    assert facts.model_evidence.startswith("the engine's ") and facts.model_evidence.endswith(
        str(path)
    )
    known = Facts(name="g", kind="llamacpp", url=NOWHERE)
    res = with_collected(known, facts)
    assert known.slots is None  # a new value: the one handed in is as it was
    assert (res.slots, res.slot_context) == (4, 2048)
    assert res.trained_context == 32768  # the endpoint's, not overwritten by the GGUF's
    assert res.layers_total == geo.n_layer + 1 and res.weights_bytes == geo.weight_bytes
    assert res.kv_bytes_per_token == geo.kv_bytes_per_token()
    assert res.prefill.matmul_flops is not None


async def test_a_model_file_not_here_leaves_the_geometry_unknown(tmp_path: Path) -> None:
    missing = tmp_path / "elsewhere.gguf"
    target = Target("g", NOWHERE, "llamacpp", None, None)
    facts = await collect_facts(_engine(), _opts(str(missing)), target, None)
    assert facts.model_path == missing and facts.geometry is None
    res = with_collected(Facts(name="g", kind="llamacpp", url=NOWHERE), facts)
    assert (res.slots, res.trained_context, res.layers_total, res.weights_bytes) == (
        4,
        32768,
        None,
        None,
    )
    # A path given in the config wins over the endpoint's, and says so.
    given = tmp_path / "given.gguf"
    facts = await collect_facts(_engine(), _opts(str(missing)), target, given)
    assert facts.model_path == given
