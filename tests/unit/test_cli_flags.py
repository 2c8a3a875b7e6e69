"""One command line: the same flag means the same thing in every subcommand (issue 25)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
from pathlib import Path

import pytest
import tomllib

from cli.loadgen import build_parser, default_commands
from exporter import __version__
from loadgen.options import UsageError, int_list, out_folder
from tests.paths import ROOT

SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser(default_commands())
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_console_script_has_version(script: str) -> None:
    module, func = SCRIPTS[script].split(":")
    main = getattr(importlib.import_module(module), func)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = main(["--version"])
        except SystemExit as exc:  # argparse's version action
            code = exc.code
    assert out.getvalue().strip() == f"{script} {__version__}"
    assert code in (0, None)


def test_a_flag_shared_by_subcommands_parses_alike() -> None:
    """Same type, action and number of values wherever a flag appears (defaults may differ)."""
    seen: dict[str, dict[str, tuple[object, ...]]] = {}
    for name, parser in subcommands().items():
        for action in parser._actions:
            shape = (action.type, action.nargs, type(action), action.dest, bool(action.choices))
            if name == "served-mix" and action.dest == "out":
                # The one --out that names a file (the mix), not a run's folder.
                assert action.metavar == "FILE" and action.type is Path
                continue
            for flag in action.option_strings:
                seen.setdefault(flag, {})[name] = shape
    differ = {flag: where for flag, where in seen.items() if len(set(where.values())) > 1}
    assert differ == {}
    # Lists everywhere: one value is a list of one (`4`), never a different type.
    for flag in ("--prompt-tokens", "--concurrency"):
        assert {shape[0] for shape in seen[flag].values()} == {int_list}, flag
        assert set(seen[flag]) == {"run", "sweep", "diagnose", "compare"}, flag
    # One live-metrics pair everywhere (on by default in run and sweep, off in the others).
    for flag in ("--metrics-port", "--metrics-host"):
        assert set(seen[flag]) == {"run", "sweep", "diagnose", "compare"}, flag
    assert "--metrics-listen" not in seen
    assert {shape[0] for shape in seen["--out"].values()} == {out_folder}
    assert set(seen["--out"]) == {"run", "sweep", "diagnose", "compare", "decide"}


def test_where_a_list_flag_takes_one_value_it_says_so() -> None:
    parser = build_parser(default_commands())
    for command in ("diagnose", "compare"):
        text = subcommands()[command].format_help()
        assert "one value here" in " ".join(text.split()), command
        args = parser.parse_args([command, "--url", "http://h:1", "--out", "o",
                                  "--prompt-tokens", "64,128"])  # fmt: skip
        from diagnose.cli import options_from_args

        with pytest.raises(UsageError, match="--prompt-tokens takes one value"):
            options_from_args(args, None)


def test_an_unset_api_key_variable_is_an_error_everywhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from diagnose.targets import engines_from_args
    from loadgen.resolve import resolve_targets

    monkeypatch.delenv("LLMB_TEST_UNSET_KEY", raising=False)
    parser = build_parser(default_commands())
    common = ["--url", "http://127.0.0.1:9", "--api-key-env", "LLMB_TEST_UNSET_KEY"]
    for command, resolve in (("run", resolve_targets), ("diagnose", engines_from_args)):
        args = parser.parse_args([command, *common, *(["--out", "o"] if command != "run" else [])])
        with pytest.raises(UsageError, match="LLMB_TEST_UNSET_KEY: the variable is not set"):
            resolve(args, None)  # type: ignore[operator]


def test_the_environment_names_are_those_of_compose_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """LLMB_HOST and LLMB_CONFIG_FILE mean the same in `.env`, natively and in the docs."""
    from config.settings import config_file_from_env, parse_config

    assert parse_config({}, environ={"LLMB_HOST": "gpu-a"}).host == "gpu-a"
    assert parse_config({"host": "file"}, environ={"LLMB_HOST": "gpu-a"}).host == "file"
    both = {"LLMB_HOST": "gpu-a", "LLMB__HOST": "gpu-b"}
    assert parse_config({}, environ=both).host == "gpu-b"
    assert config_file_from_env({"LLMB_CONFIG_FILE": "a.yaml", "LLMB_CONFIG": "b.yaml"}) == "a.yaml"
    assert config_file_from_env({"LLMB_CONFIG": "b.yaml"}) == "b.yaml"
    monkeypatch.setenv("LLMB_CONFIG_FILE", "from-env.yaml")
    monkeypatch.delenv("LLMB_CONFIG", raising=False)
    for argv in (["run", "--url", "http://h:1"], ["diagnose", "--url", "http://h:1", "--out", "o"]):
        assert build_parser(default_commands()).parse_args(argv).config == "from-env.yaml"
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "LLMB__HOST" not in compose and "LLMB_HOST: ${LLMB_HOST:-gpu-host}" in compose


def test_diagnose_serves_its_phase_metrics_on_the_shared_pair() -> None:
    import urllib.request

    from diagnose.cli import serve_metrics
    from diagnose.phase_marks import PhasePublisher
    from tests.conftest import get_free_port

    args = build_parser(default_commands()).parse_args(
        ["diagnose", "--url", "http://h:1", "--out", "o"]
    )
    assert args.metrics_port == 0 and args.metrics_host == "127.0.0.1"
    assert serve_metrics(PhasePublisher(), args.metrics_host, 0)() is None  # off: nothing served
    free = get_free_port()
    stop = serve_metrics(PhasePublisher(), "127.0.0.1", free)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{free}/metrics", timeout=5).read()
        assert b"llmb_loadgen_phase" in body
    finally:
        stop()
