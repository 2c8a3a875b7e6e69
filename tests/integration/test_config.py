"""Typed config: defaults, every error at once, env overrides, --check-only exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from config.settings import ConfigError, load_config, parse_config
from tests.paths import ROOT
from tests.plugins.cli import run_module

MINIMAL = """\
listen: "127.0.0.1:9490"
engines:
  - {name: llama, kind: llamacpp, url: "http://127.0.0.1:8080"}
  - {name: sgl, kind: sglang, url: "http://127.0.0.1:30000"}
"""

THREE_MISTAKES = """\
listen: "127.0.0.1:9490"
engines:
  - {name: llama, kind: llamacp, url: "http://127.0.0.1:8080"}
  - {name: sgl, kind: sglang, url: "127.0.0.1:30000"}
gpu: {sample_interval: 0.1}
"""


def test_minimal_file_from_the_issue(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(MINIMAL)
    config = load_config(path, environ={})
    assert [(e.name, e.kind, e.url) for e in config.engines] == [
        ("llama", "llamacpp", "http://127.0.0.1:8080"),
        ("sgl", "sglang", "http://127.0.0.1:30000"),
    ]
    assert config.gpu.sample_interval_seconds == 0.1  # >= 10 Hz by default
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 9490)


def test_example_file_is_valid() -> None:
    config = load_config(ROOT / "config.example.yaml", environ={})
    assert {e.name for e in config.engines} == {"llama", "sgl"}


def test_every_error_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(THREE_MISTAKES)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    errors = info.value.errors
    assert len(errors) == 3
    assert any(e.startswith("engines.0(llama).kind") for e in errors)
    assert any(e.startswith("engines.1(sgl).url") for e in errors)
    assert "gpu.sample_interval: unknown key" in errors


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"engines": [{"name": "a", "kind": "llamacpp", "url": "http://x:1"}] * 2}, "used twice"),
        ({"engines": [{"name": "nvml", "kind": "sglang", "url": "http://x:1"}]}, "reserved"),
        ({"listen": "9490"}, "HOST:PORT"),
        (
            {
                "engines": [
                    {
                        "name": "a",
                        "kind": "llamacpp",
                        "url": "http://x:1",
                        "process": {"cmdline_regex": "("},
                    }
                ]
            },
            "regular expression",
        ),
        ({"gpu": {"bandwidth_bytes_per_second": -1}}, "positive"),
        ([1, 2], "mapping"),
    ],
)
def test_bad_values(data: object, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data, environ={})
    assert expected in "\n".join(info.value.errors)


def test_env_overrides_by_engine_name() -> None:
    import yaml

    env = {
        "LLMB__LISTEN": "0.0.0.0:9999",
        "LLMB__ENGINES__LLAMA__URL": "http://llamacpp:8080",
        "LLMB__GPU__SAMPLE_INTERVAL_SECONDS": "0.05",
        "LLMB__GPU__ENABLED": "false",
        "UNRELATED": "1",
    }
    config = parse_config(yaml.safe_load(MINIMAL), environ=env)
    assert config.listen == "0.0.0.0:9999"
    assert config.engine("llama").url == "http://llamacpp:8080"
    assert config.gpu.sample_interval_seconds == 0.05
    assert config.gpu.enabled is False


def test_api_key_from_env_only() -> None:
    config = parse_config(
        {"engines": [{"name": "a", "kind": "llamacpp", "url": "http://x:1", "api_key_env": "K"}]},
        environ={},
    )
    engine = config.engine("a")
    assert engine.api_key({"K": "secret"}) == "secret"
    assert engine.api_key({}) is None
    assert "secret" not in repr(config)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_module("exporter", *args)


def test_check_only_prints_all_three_mistakes(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(THREE_MISTAKES)
    proc = _cli("--config", str(path), "--check-only")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "3 errors" in proc.stderr
    assert "engines.0(llama).kind" in proc.stderr
    assert "engines.1(sgl).url" in proc.stderr
    assert "gpu.sample_interval: unknown key" in proc.stderr


def test_check_only_ok_and_unreadable(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(MINIMAL)
    assert _cli("--config", str(good), "--check-only").returncode == 0
    missing = _cli("--config", str(tmp_path / "nope.yaml"), "--check-only")
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("engines: [\n")
    proc = _cli("--config", str(broken), "--check-only")
    assert proc.returncode == 2 and "not valid YAML" in proc.stderr


def test_the_exporter_loads_only_the_loadgen_section_model() -> None:
    # The exporter's image has the base dependencies only: its config must not pull in
    # the load generator (aiohttp client, orjson, tqdm...).
    code = "import sys, config.settings; print(sorted(m for m in sys.modules if 'loadgen' in m))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['config.loadgen']"
