"""Shared options of `run`, `sweep`, `diagnose`, `compare` (loadgen/options.py), the help,
the explicit subcommand list and the live-metrics address (unit tests, then CLI runs against
the stub)."""

from __future__ import annotations

import argparse
import json
import socket
from pathlib import Path

import pytest

from cli.loadgen import build_parser, default_commands, main
from config.loadgen import LoadgenSettings
from config.settings import ConfigError, parse_config
from loadgen.options import (
    DEFAULT_METRICS_HOST,
    HelpFormatter,
    exporter_url,
    int_list,
    metrics_url,
)
from loadgen.session import SessionOptions
from tests.plugins.loadgen import StubFactory, request_lines, run_cli


def test_every_subcommand_is_registered_explicitly() -> None:
    names = [c.name for c in default_commands()]
    assert names == ["run", "sweep", "served-mix", "diagnose", "compare", "decide"]


@pytest.mark.parametrize(
    "given",
    ["http://h:9490", "http://h:9490/", "http://h:9490/metrics", "http://h:9490/metrics/"],
)
def test_exporter_url_with_or_without_metrics(given: str) -> None:
    assert exporter_url(given) == "http://h:9490"
    assert metrics_url(given) == "http://h:9490/metrics"


@pytest.mark.parametrize("text", ["0", "1,x", "", "-2", "1,,0", "1,,2", "1,2,", ",4"])
def test_bad_lists_are_rejected(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        int_list(text)


def test_concurrency_is_a_list_in_run_and_sweep() -> None:
    parser = build_parser(default_commands())
    for command in ("run", "sweep"):
        args = parser.parse_args([command, "--url", "http://x", "--concurrency", "1,2,4"])
        assert args.concurrency == [1, 2, 4]
        args = parser.parse_args([command, "--url", "http://x", "--concurrency", "8"])
        assert args.concurrency == [8]


def test_defaults_are_shown_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("run", "sweep"):
        assert main([command, "--help"]) == 0
        text = " ".join(capsys.readouterr().out.split())
        for shown in (
            "(default: 600.0)",  # --timeout
            "(default: 128)",  # --max-tokens
            "(default: 127.0.0.1)",  # --metrics-host
            "(default: 9491)",  # --metrics-port
            "(default: 0)",  # --warmup: a zero default is a default too
            "(default: 0.5)",  # --max-errors
        ):
            assert shown in text, (command, shown)
        assert "(default: None)" not in text


def test_help_formatter_keeps_explicit_defaults() -> None:
    parser = argparse.ArgumentParser(formatter_class=HelpFormatter)
    parser.add_argument("--a", default=3, help="with an own text (default 3 here)")
    parser.add_argument("--b", default=None, help="no default")
    parser.add_argument("--c", default=[1, 2], help="a list")
    text = " ".join(parser.format_help().split())
    assert "(default 3 here)" in text and "(default: 3)" not in text
    assert "no default (default" not in text
    assert "a list (default: 1,2)" in text


def test_metrics_are_served_on_loopback_by_default() -> None:
    parser = build_parser(default_commands())
    assert parser.parse_args(["run", "--url", "http://x"]).metrics_host == "127.0.0.1"
    assert SessionOptions(out_dir=None).metrics_host == DEFAULT_METRICS_HOST == "127.0.0.1"


def test_busy_metrics_port_is_one_line_and_exit_2(
    stub: StubFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = stub()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(
            [
                "run", "--url", server.url, "--out", str(tmp_path), "--no-progress",
                "--metrics-port", str(port), "--requests", "2", "--prompt-tokens", "16",
            ]
        )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("llmb-loadgen: error: cannot serve metrics on 127.0.0.1:")
    assert "--metrics-port" in last
    assert server.state.requests == 0  # nothing was sent


def test_run_with_a_concurrency_list_runs_one_step_each(stub: StubFactory, tmp_path: Path) -> None:
    """The issue 13 reproduction: `run --concurrency 1,2` used to fail with
    "invalid _positive_int value"."""
    server = stub()
    code = run_cli(
        tmp_path,
        *("--url", server.url, "--concurrency", "1,2", "--requests", "4"),
        *("--prompt-tokens", "16", "--max-tokens", "4"),
    )
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(s["step"], s["concurrency"]) for s in summary["steps"]] == [(0, 1), (1, 2)]
    assert summary["valid"] is True and summary["aborted"] is False
    assert sorted({r["step"] for r in request_lines(tmp_path)}) == [0, 1]
    assert summary["run"]["argv"][:2] == ["llmb-loadgen", "run"]


def test_workers_take_one_concurrency(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run_cli(
        tmp_path, "--url", "http://127.0.0.1:1", "--workers", "2", "--concurrency", "2,4"
    )
    assert code == 2
    assert "one --concurrency value" in capsys.readouterr().err


@pytest.mark.parametrize(("value", "steps"), [("4", [4]), ("[1, 2]", [1, 2]), ("'1,2'", [1, 2])])
def test_config_defaults_go_through_the_option_types(
    stub: StubFactory, tmp_path: Path, value: str, steps: list[int]
) -> None:
    server = stub()
    config = tmp_path / "config.yaml"
    config.write_text(
        f"engines:\n  - {{name: s, kind: llamacpp, url: '{server.url}'}}\n"
        f"loadgen: {{concurrency: {value}, requests: 2, max_tokens: 3, prompt_tokens: 16}}\n"
    )
    code = run_cli(tmp_path / "o", "--config", str(config), "--engine", "s")
    assert code == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert [s["concurrency"] for s in summary["steps"]] == steps


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ("{max_tokens: -32}", "loadgen.max_tokens: must be at least 1, got -32"),
        ("{concurrency: '1,,2'}", "loadgen.concurrency: an empty item in the list '1,,2'"),
        # Keys of other commands too (served-mix's window, --traffic-from's window).
        ("{window: 5x}", "loadgen.window: expected a Prometheus duration"),
        ("{traffic_window: 0s}", "loadgen.traffic_window: expected a Prometheus duration"),
    ],
)
def test_a_bad_config_value_is_named_by_its_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, says: str
) -> None:
    """Not `argument --traffic-window: ...`, a flag the user never gave; exit 2 before any
    request, whichever command reads the file."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "engines:\n  - {name: s, kind: llamacpp, url: 'http://127.0.0.1:1'}\n"
        f"loadgen: {section}\n"
    )
    for command in ("run", "diagnose"):
        assert main([command, "--config", str(config), "--engine", "s"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"llmb-loadgen: error: {config}: {says}"), err
        assert len(err.strip().splitlines()) == 1, err


def test_a_flag_given_overrides_its_config_value_unchecked(
    stub: StubFactory, tmp_path: Path
) -> None:
    """`out:` naming a folder that holds a run is refused, unless --out gives another."""
    server = stub()
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "summary.json").write_text("{}")
    config = tmp_path / "config.yaml"
    config.write_text(
        f"engines:\n  - {{name: s, kind: llamacpp, url: '{server.url}'}}\n"
        f"loadgen: {{out: '{tmp_path / 'done'}', requests: 1, max_tokens: 2, prompt_tokens: 16}}\n"
    )
    assert main(["run", "--config", str(config), "--engine", "s"]) == 2
    assert (
        main(["run", "--config", str(config), "--engine", "s", "--out", str(tmp_path / "n")]) == 0
    )
    assert (tmp_path / "done" / "summary.json").read_text() == "{}"


def test_loadgen_settings_are_the_flags_of_the_subcommands() -> None:
    # One key per flag of some subcommand (the config naming itself aside): a new flag
    # without a key, or a key left behind by a removed flag, fails here.
    parser = build_parser(default_commands())
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    # Positional arguments (decide's DIR) name what to act on: no config key.
    dests = {
        a.dest for sub in subparsers.choices.values() for a in sub._actions if a.option_strings
    }
    assert set(LoadgenSettings.model_fields) == dests - {"help", "config"}


def test_loadgen_section_is_typed_in_the_config_file() -> None:
    config = parse_config({"loadgen": {"max_tokens": 6, "contexts": "1024,2048", "rate": None}})
    assert config.loadgen.given() == {"max_tokens": 6, "contexts": "1024,2048", "rate": None}
    assert parse_config({}).loadgen.given() == {}
    with pytest.raises(ConfigError) as bad:
        parse_config({"loadgen": {"max_tokenz": 3, "kind": "vllm", "concurrency": {"a": 1}}})
    errors = "\n".join(bad.value.errors)
    assert "loadgen.max_tokenz: unknown key" in errors
    assert "loadgen.kind: Input should be 'llamacpp', 'sglang' or 'openai'" in errors
    assert "loadgen.concurrency" in errors


def test_third_party_loggers_are_quiet(stub: StubFactory, tmp_path: Path) -> None:
    import logging

    from loadgen.cli import QUIET_LOGGERS

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    server = stub()
    assert run_cli(tmp_path, "--url", server.url, "--requests", "1", "--prompt-tokens", "16") == 0
    for name in ("matplotlib", "httpx", "aiohttp.access"):
        assert logging.getLogger(name).getEffectiveLevel() == logging.WARNING, name


def test_max_errors_is_a_share(capsys: pytest.CaptureFixture[str]) -> None:
    """Documented as a share from 0 to 1; `2` was taken (and meant the same as 1)."""
    for bad in ("2", "-0.1", "nan"):
        assert main(["run", "--url", "http://127.0.0.1:1", "--max-errors", bad]) == 2
        assert "argument --max-errors: must be a share from 0 to 1" in capsys.readouterr().err
    args = build_parser(default_commands()).parse_args(
        ["run", "--url", "http://x", "--max-errors", "1"]
    )
    assert args.max_errors == 1.0
