"""`${VAR}` in config values (config/expand.py) and the host profile's link (exporter/link.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from config.expand import expand_text
from config.settings import ConfigError, load_config
from exporter import link


def test_expansion_follows_compose() -> None:
    env = {"A": "x", "EMPTY": ""}
    assert expand_text("${A}/${B}", env) == "x/"
    assert expand_text("${A:-d} ${B:-d} ${EMPTY:-d}", env) == "x d d"
    assert expand_text("${A:+alt} ${B:+alt} ${EMPTY:+alt}", env) == "alt  "
    assert expand_text("$$A $${A} $A {A}", env) == "$A ${A} $A {A}"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


ENGINES = """
engines:
  - name: llama
    kind: llamacpp
    url: "${LLAMACPP_URL:-}"
    log_file: "${LOG:+/var/log/llmb/llama-server.log}"
    model_path: "/models/${MODEL:-model.gguf}"
    launch:
      command: "llama-server -m {model} --log-file $${HOME}/x.log"
  - name: sgl
    kind: sglang
    url: "${SGLANG_URL:-}"
"""


def test_an_engine_whose_url_is_empty_is_not_configured(tmp_path: Path) -> None:
    path = write(tmp_path, ENGINES)
    assert load_config(path, environ={}).engines == []
    (llama,) = load_config(path, environ={"LLAMACPP_URL": "http://127.0.0.1:8080"}).engines
    assert llama.log_file is None  # an optional key that came out empty is left out
    assert str(llama.model_path) == "/models/model.gguf"
    assert llama.launch is not None and "${HOME}/x.log" in llama.launch.command
    env = {"LLAMACPP_URL": "http://h:1", "SGLANG_URL": "http://h:2", "LOG": "1", "MODEL": "m"}
    llama, sgl = load_config(path, environ=env).engines
    assert str(llama.log_file) == "/var/log/llmb/llama-server.log"
    assert str(llama.model_path) == "/models/m" and sgl.url == "http://h:2"
    # LLMB__ overrides still apply after the expansion.
    env["LLMB__ENGINES__SGL__URL"] = "http://h:3"
    assert load_config(path, environ=env).engines[1].url == "http://h:3"


def test_a_literal_empty_url_is_still_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, 'engines: [{name: a, kind: llamacpp, url: ""}]')
    with pytest.raises(ConfigError, match=r"engines\.0"):
        load_config(path, environ={})


def test_aliases_are_expanded_once_each(tmp_path: Path) -> None:
    """Nested aliases cost their size, not their expansion (a billion laughs)."""
    lines = ['a0: &a0 ["${X:-x}"]']
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 40)]
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(write(tmp_path, "\n".join(lines)), environ={})


def test_link_relays_only_loopback_urls_once() -> None:
    urls = ["http://127.0.0.1:8080", "", "http://localhost:8080/v1", "http://10.0.0.2:30000",
            "https://127.0.0.1", "http://127.0.0.1:8080/"]  # fmt: skip
    assert link.loopback_addresses(urls) == [
        ("127.0.0.1", 8080),
        ("localhost", 8080),
        ("127.0.0.1", 443),
    ]


async def test_the_two_halves_carry_a_request_and_refuse_when_the_engine_is_gone(
    tmp_path: Path,
) -> None:
    """local (TCP) -> unix socket -> host (TCP): bytes both ways, EOF passed on."""

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()  # until the client's EOF: half-close is relayed
        writer.write(b"echo:" + data)
        await writer.drain()
        writer.close()

    upstream = await asyncio.start_server(engine, "127.0.0.1", 0)
    up_port = upstream.sockets[0].getsockname()[1]
    # The local half listens where the exporter connects: a free port of this namespace.
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    local_port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    host_side = await link.serve("host", tmp_path, [("127.0.0.1", up_port)])
    # Both halves name the socket alike; the local half points at the host half's socket.
    link.socket_path(tmp_path, "127.0.0.1", up_port).rename(
        link.socket_path(tmp_path, "127.0.0.1", local_port)
    )
    local_side = await link.serve("local", tmp_path, [("127.0.0.1", local_port)])
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", local_port)
        writer.write(b"GET /health" * 10000)
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 10) == b"echo:" + b"GET /health" * 10000
        writer.close()
        upstream.close()
        await upstream.wait_closed()
        reader, writer = await asyncio.open_connection("127.0.0.1", local_port)
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed: engine not there
        writer.close()
    finally:
        for server in (*host_side, *local_side):
            server.close()
            await server.wait_closed()


def test_invalid_yaml_names_the_file_and_line_not_a_unicode_string(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("engines:\n  - name: a\n   kind: x\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    (message,) = err.value.errors
    assert message.startswith(f"{path}: not valid YAML: while parsing a block collection")
    assert "line 3, column 4" in message and "<unicode string>" not in message
