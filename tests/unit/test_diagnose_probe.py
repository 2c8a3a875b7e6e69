"""A target is probed once, through one client (the load generator's aiohttp client).

`loadgen.resolve.probe_target` reads `/v1/models` and the kind's info endpoint (the kind told
by the first registered info endpoint that answers), with the same `Authorization` header
every later request sends; a server that answers no registered info endpoint is `openai`.
`diagnose --url` hands that probe on to the facts, so the engine is asked once; network
errors leave a part unknown, a bug is a traceback.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cli.loadgen import build_parser, default_commands, main
from config.kinds import GENERIC
from diagnose.cli import options_from_args
from diagnose.phase_marks import PhasePublisher
from diagnose.probe import engine_facts
from diagnose.procedure import Diagnoser
from diagnose.targets import measured_engines
from loadgen.client import StreamClient, probe_client
from loadgen.options import UsageError
from loadgen.resolve import TargetProbe, probe_target, probe_url
from tests.conftest import get_free_port

MODELS = {"data": [{"id": "/models/gemma-3-270m.gguf", "meta": {"n_ctx_train": 32768}}]}
PROPS = {"total_slots": 4, "default_generation_settings": {"n_ctx": 2048}}


async def _probe(url: str, key: str | None, kind: str, info: bool = True) -> TargetProbe:
    # probe_url runs its own event loop (the CLI's resolution is synchronous).
    return await asyncio.to_thread(probe_url, url, key, kind, 5.0, info)


async def test_llama_server_is_told_by_props_with_the_key(serve: Any) -> None:
    url, seen = await serve({"/props": PROPS, "/v1/models": MODELS})
    probe = await _probe(url, "k", GENERIC)
    assert probe == TargetProbe("llamacpp", MODELS, PROPS)
    assert probe.model == "/models/gemma-3-270m.gguf"
    assert seen == [("/v1/models", "Bearer k"), ("/props", "Bearer k")]


async def test_sglang_is_told_by_server_info(serve: Any) -> None:
    url, seen = await serve({"/server_info": {"context_length": 8192}})
    probe = await _probe(url, None, GENERIC)
    assert probe == TargetProbe("sglang", None, {"context_length": 8192})
    assert probe.model is None
    assert [p for p, _ in seen] == ["/server_info"]  # /v1/models and /props: 404


async def test_a_given_kind_asks_only_its_own_info_endpoint(serve: Any) -> None:
    url, seen = await serve({"/props": PROPS, "/v1/models": MODELS, "/server_info": {}})
    assert await _probe(url, None, "sglang") == TargetProbe("sglang", MODELS, {})
    assert [p for p, _ in seen] == ["/v1/models", "/server_info"]


async def test_run_asks_only_the_model(serve: Any) -> None:
    url, seen = await serve({"/props": PROPS, "/v1/models": MODELS})
    assert await _probe(url, None, GENERIC, info=False) == TargetProbe(GENERIC, MODELS)
    assert [p for p, _ in seen] == ["/v1/models"]


async def test_neither_endpoint_is_openai_and_nothing_listening_too(serve: Any) -> None:
    url, _ = await serve({"/props": ["not", "an", "object"], "/v1/models": MODELS})
    assert await _probe(url, None, GENERIC) == TargetProbe(GENERIC, MODELS)
    closed = f"http://127.0.0.1:{get_free_port()}"
    dead = await _probe(closed, None, GENERIC)
    assert dead.kind == GENERIC and dead.models is None and dead.info == {}
    assert dead.unreachable is not None and "Cannot connect" in dead.unreachable


async def test_diagnose_url_asks_v1_models_once(serve: Any, tmp_path: Path) -> None:
    """`diagnose --url`: kind, name and facts from one probe (once /v1/models, once /props)."""
    url, seen = await serve({"/props": PROPS, "/v1/models": MODELS})
    args = build_parser(default_commands()).parse_args(
        ["diagnose", "--url", url, "--out", str(tmp_path / "out")]
    )
    measured = await asyncio.to_thread(measured_engines, "diagnose", args, None)
    (engine,) = measured.engines
    assert (engine.name, engine.kind) == ("gemma-3-270m", "llamacpp")
    opts = options_from_args(args, None)
    opts.probes = measured.probes
    run = Diagnoser(engine, opts, tmp_path / "out", PhasePublisher())
    await run.read_facts()
    assert Counter(p for p, _ in seen) == {"/v1/models": 1, "/props": 1}
    # Where the model file came from lands in the run's evidence (the answer's "model" line).
    assert run.evidence["model"] == "not seen: no /props model_path (pass --model-path)"
    res = run.facts
    assert (res.model, res.slots, res.slot_context, res.trained_context) == (
        "/models/gemma-3-270m.gguf",
        4,
        2048,
        32768,
    )


async def test_a_configured_engine_is_probed_by_the_facts_once(serve: Any, tmp_path: Path) -> None:
    """An engine of the config (no --url resolution) is probed by collect_facts, once."""
    url, seen = await serve({"/props": PROPS, "/v1/models": MODELS})
    args = build_parser(default_commands()).parse_args(
        ["diagnose", "--url", url, "--kind", "llamacpp", "--name", "g", "--out", "o"]
    )
    engine = (await asyncio.to_thread(measured_engines, "diagnose", args, None)).engines[0]
    seen.clear()
    run = Diagnoser(engine, options_from_args(args, None), tmp_path, PhasePublisher())
    await run.read_facts()  # opts.probes empty: the facts probe it themselves
    assert Counter(p for p, _ in seen) == {"/v1/models": 1, "/props": 1}
    assert run.facts.slots == 4


async def test_a_bug_in_the_probe_is_a_traceback(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Network errors leave facts unknown; any other exception propagates (no 'not seen')."""
    url, _ = await serve({"/props": PROPS, "/v1/models": MODELS})

    async def broken(self: StreamClient, path: str, timeout: float = 10.0) -> Any:
        return {}["not a network error"]

    monkeypatch.setattr(StreamClient, "get_json", broken)
    async with probe_client(url, None) as client:
        with pytest.raises(KeyError, match="not a network error"):
            await probe_target(client, GENERIC)


def test_odd_shapes_leave_facts_unknown_but_a_reader_bug_propagates() -> None:
    odd = TargetProbe(
        "llamacpp",
        {"data": [{"id": "m", "meta": {"size": "many", "n_ctx_train": [1]}}]},
        {"total_slots": "four", "default_generation_settings": ["n_ctx"], "model_ftype": "Q4"},
    )
    assert engine_facts(odd).known() == {"model": "m", "quantization": "Q4"}
    assert engine_facts(TargetProbe("sglang", ["no", "object"], {})).known() == {}
    with pytest.raises(AttributeError):
        engine_facts(TargetProbe("llamacpp", None, "not a dict"))  # type: ignore[arg-type]


async def test_a_server_of_no_registered_kind_is_told_how_to_say_it(serve: Any) -> None:
    url, seen = await serve({"/v1/models": MODELS})
    args = build_parser(default_commands()).parse_args(["diagnose", "--url", url, "--out", "o"])
    with pytest.raises(UsageError) as err:
        await asyncio.to_thread(measured_engines, "diagnose", args, None)
    assert str(err.value) == (
        f"{url} answers neither llama.cpp's /props nor SGLang's /server_info; "
        "pass --kind llamacpp or --kind sglang"
    )
    assert [p for p, _ in seen] == ["/v1/models"]  # once; /props and /server_info: 404


async def test_nothing_at_the_url_is_unreachable_not_a_kind_to_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dead port is exit 1 and says it cannot reach the URL, before anything is measured or
    written (it used to ask for --kind, and with --kind diagnosed nothing as `idle`)."""
    url = f"http://127.0.0.1:{get_free_port()}"
    probe = await _probe(url, None, GENERIC)
    assert probe.unreachable is not None and probe.models is None and probe.info == {}
    for kind in ([], ["--kind", "llamacpp"]):
        out = tmp_path / "diag"
        code = await asyncio.to_thread(main, ["diagnose", "--url", url, *kind, "--out", str(out)])
        assert code == 1
        err = capsys.readouterr().err
        assert f"cannot reach {url} (" in err and "is the engine running there?" in err, err
        assert not out.exists()


async def test_an_openai_base_url_is_told_to_drop_the_v1(serve: Any) -> None:
    url, _ = await serve({"/props": PROPS, "/v1/models": MODELS})
    args = build_parser(default_commands()).parse_args(
        ["diagnose", "--url", url + "/v1", "--out", "o"]
    )
    with pytest.raises(
        UsageError, match=r"answers neither .* \(give the server's address without /v1\)"
    ):
        await asyncio.to_thread(measured_engines, "diagnose", args, None)


async def test_a_kind_that_does_not_tokenize_is_one_message_not_a_traceback(
    serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--kind llamacpp given to a server that is no llama-server: its /tokenize does not answer
    a token list, and diagnose says so (exit 1) instead of a ClientResponseError traceback."""
    url, _ = await serve({"/v1/models": MODELS})
    argv = ["diagnose", "--url", url, "--kind", "llamacpp", "--out", str(tmp_path / "d")]
    argv += ["--concurrency", "1", "--max-tokens", "4", "--host-bandwidth-gbs", "50"]
    assert await asyncio.to_thread(main, argv) == 1
    err = capsys.readouterr().err
    assert f"{url}/tokenize answers HTTP " in err and "is it a llamacpp server (--kind)?" in err
    assert "Traceback" not in err
