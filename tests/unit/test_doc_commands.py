"""Every documented command runs: each `llmb-*`, `make` and `docker compose` line of README.md
and docs/*.md, parsed by the real parsers (issue 25).

* `llmb-loadgen`, `llmb-exporter`, `llmb-sim`, `llmb-synth-model`: the console scripts'
  argparse parsers. A line in a code block is parsed whole (a missing required option fails
  too); an inline one (often a fragment: "`llmb-loadgen run`") must name existing
  subcommands and flags. `[...]` marks optional parts and `A|B` alternatives: each is checked.
* `--engine NAME` must be an engine of the config the line uses (`--config config.yaml`: the
  copied config.example.yaml; `/etc/llmb/config.yaml` in compose: the deploy/compose configs).
* `make TARGET`: a target of the Makefile. `docker compose`: profiles and services of
  docker-compose.yml, and what a `run --entrypoint llmb-loadgen` or `LOADGEN_ARGS=` passes on.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.paths import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SCRIPTS = ("llmb-loadgen", "llmb-exporter", "llmb-sim", "llmb-synth-model")
COMPOSE_CONFIG = "/etc/llmb/config.yaml"


@dataclass(frozen=True)
class Line:
    """One documented command line, where it is, and whether it must parse whole."""

    where: str
    text: str
    whole: bool


def _code_blocks(path: Path) -> Iterator[Line]:
    lines = path.read_text(encoding="utf-8").splitlines()
    fenced, pending, start = False, "", 0
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            continue
        text = re.sub(r"(^|\s)#.*$", "", line).strip()  # a shell comment
        if pending:
            text = f"{pending} {text}"
        else:
            start = number
        if text.endswith("\\"):
            pending = text[:-1].strip()
            continue
        pending = ""
        if text:
            yield Line(f"{path.name}:{start}", text, whole=True)


def _inline_spans(path: Path) -> Iterator[Line]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    for match in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
        number = text.count("\n", 0, match.start()) + 1
        span = " ".join(match.group(1).split())
        yield Line(f"{path.name}:{number}", span, whole=False)


def documented() -> list[Line]:
    starts = (*SCRIPTS, "make ", "docker compose ", "~/llmb/bin/llmb-", ".venv/bin/llmb-")
    found = []
    for path in DOCS:
        for line in [*_code_blocks(path), *_inline_spans(path)]:
            body = re.sub(r"^([A-Z_]+=(\"[^\"]*\"|\S*) )+", "", line.text)
            if body.startswith(starts) and not body.startswith(tuple(f"{s}:" for s in SCRIPTS)):
                found.append(line)
    return found


# --- the parsers ---------------------------------------------------------------------------


def _parsers() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    from cli.loadgen import build_parser, default_commands
    from simulator import demo
    from simulator.__main__ import build_parser as sim_parser
    from tools.synth_model.cli import _parser as synth_parser

    def exporter() -> argparse.ArgumentParser:
        import exporter.__main__ as main

        captured: list[argparse.ArgumentParser] = []
        real = argparse.ArgumentParser.parse_args

        def keep(self: argparse.ArgumentParser, *a: object, **k: object) -> argparse.Namespace:
            captured.append(self)
            return argparse.Namespace()

        argparse.ArgumentParser.parse_args = keep  # type: ignore[assignment,method-assign]
        try:
            main.parse_args([])
        finally:
            argparse.ArgumentParser.parse_args = real  # type: ignore[method-assign]
        return captured[0]

    return {
        "llmb-loadgen": lambda: build_parser(default_commands()),
        "llmb-exporter": exporter,
        "llmb-sim": sim_parser,
        "llmb-sim demo": demo.build_parser,
        "llmb-synth-model": synth_parser,
    }


PARSERS = _parsers()


def parse(script: str, argv: list[str]) -> tuple[argparse.Namespace | None, str]:
    """Parse `argv` with the script's real parser: (namespace, '') or (None, the error)."""
    if script == "llmb-sim" and argv[:1] == ["demo"]:
        script, argv = "llmb-sim demo", argv[1:]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return PARSERS[script]().parse_args(argv), ""
        except SystemExit as exc:
            return (None, err.getvalue().strip()) if exc.code else (argparse.Namespace(), "")


def _options(
    parser: argparse.ArgumentParser,
) -> tuple[set[str], dict[str, argparse.ArgumentParser]]:
    flags: set[str] = set()
    subs: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        flags.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            subs.update(action.choices)
    return flags, subs


def unknown_names(script: str, argv: list[str]) -> list[str]:
    """Subcommands and flags in `argv` that the script does not have (fragments allowed)."""
    if script == "llmb-sim" and argv[:1] == ["demo"]:
        script, argv = "llmb-sim demo", argv[1:]
    flags, subs = _options(PARSERS[script]())
    bad: list[str] = []
    for i, token in enumerate(argv):
        if subs and i == 0 and not token.startswith("-"):
            names = token.split("|")
            bad += [n for n in names if n not in subs]
            if names[0] in subs:
                flags |= _options(subs[names[0]])[0]
            continue
        if token.startswith("-") and not re.fullmatch(r"-\d.*", token):
            bad += [f for f in token.split("=", 1)[0].split("|") if f not in flags]
    return bad


# --- engines of the config a line uses -------------------------------------------------------


def _engine_names(path: Path) -> set[str]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return {e["name"] for e in doc.get("engines") or []}


def config_engines(config: str | None) -> set[str] | None:
    """Engine names of the config a documented line reads; None when it names none."""
    if config is None:
        return None
    if config == COMPOSE_CONFIG:
        return set().union(
            *(_engine_names(p) for p in (ROOT / "deploy" / "compose").glob("*.yaml"))
        )
    if Path(config).name in ("config.yaml", "config.example.yaml"):
        return _engine_names(ROOT / "config.example.yaml")
    shipped = ROOT / config
    assert shipped.is_file(), f"--config {config}: no such file in the repository"
    return _engine_names(shipped)


# --- one line ------------------------------------------------------------------------------


def _variants(text: str) -> list[str]:
    """`[...]` optional parts kept; the text as one line."""
    return [text.replace("[", "").replace("]", "")]


def check_script(script: str, argv: list[str], whole: bool) -> list[str]:
    problems = [f"no such subcommand or flag: {n}" for n in unknown_names(script, argv)]
    # Alternatives, ellipses and placeholders (NAME, FILE, HOST:PORT) are not values to parse.
    shown = any("|" in t or t == "..." or re.fullmatch(r"[A-Z][A-Z_]*(:[A-Z]+)?", t) for t in argv)
    if whole and not problems and not shown:
        args, error = parse(script, argv)
        if args is None:
            problems.append(error.splitlines()[-1])
    if script == "llmb-loadgen" and "--engine" in argv:
        config = argv[argv.index("--config") + 1] if "--config" in argv else None
        known = config_engines(config)
        named = [argv[i + 1] for i, t in enumerate(argv[:-1]) if t == "--engine"]
        if known is not None:
            problems += [
                f"--engine {n}: not an engine of {config}" for n in named if n not in known
            ]
    return problems


def _compose_file() -> tuple[set[str], set[str]]:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    profiles = {p for s in services.values() for p in s.get("profiles", [])}
    return set(services), profiles


def check_compose(argv: list[str], env: dict[str, str]) -> list[str]:
    services, profiles = _compose_file()
    problems: list[str] = []
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] == "--profile":
            if argv[i + 1] not in profiles:
                problems.append(f"no such profile: {argv[i + 1]}")
            i += 1
        i += 1
    command, rest = (argv[i], argv[i + 1 :]) if i < len(argv) else ("", [])
    entrypoint = None
    named: list[str] = []
    j = 0
    while j < len(rest):
        token = rest[j]
        if token == "--entrypoint":
            entrypoint, j = rest[j + 1], j + 2
            continue
        if token.startswith("-"):
            j += 1
            continue
        named.append(token)
        if command == "run":
            break
        j += 1
    problems += [f"no such service: {s}" for s in named if s not in services]
    args = rest[j + 1 :] if command == "run" else []
    if entrypoint in SCRIPTS and args:
        problems += check_script(entrypoint, args, whole=True)
    if "LOADGEN_ARGS" in env and "loadgen" in named:
        load = ["run", "--config", COMPOSE_CONFIG, *shlex.split(env["LOADGEN_ARGS"])]
        problems += check_script("llmb-loadgen", load, whole=True)
    return problems


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][\w-]*):", text, flags=re.M))


def check(line: Line) -> list[str]:
    env = dict(re.findall(r"([A-Z_]+)=\"([^\"]*)\"", line.text))
    body = re.sub(r"^([A-Z_]+=(\"[^\"]*\"|\S*) )+", "", line.text)
    body = re.sub(r"^(~/llmb/bin/|\.venv/bin/)", "", body)
    problems: list[str] = []
    for text in _variants(body):
        try:
            argv = shlex.split(text)
        except ValueError as exc:
            return [f"not a shell line: {exc}"]
        if argv[0] in SCRIPTS:
            problems += check_script(argv[0], argv[1:], line.whole)
        elif argv[0] == "make":
            targets = [t for t in argv[1:] if "=" not in t and not t.startswith("-")]
            problems += [f"no make target {t}" for t in targets if t not in _makefile_targets()]
        elif argv[:2] == ["docker", "compose"]:
            problems += check_compose(argv[2:], env)
    return problems


LINES = documented()


def test_the_docs_have_commands_of_every_kind() -> None:
    texts = [line.text for line in LINES]
    for start in (*SCRIPTS, "make ", "docker compose "):
        assert any(t.startswith(start) or f"bin/{start}" in t for t in texts), start
    assert len(LINES) > 50


@pytest.mark.parametrize("line", LINES, ids=[line.where for line in LINES])
def test_every_documented_command_parses(line: Line) -> None:
    assert check(line) == [], line.text


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("llmb-loadgen diagnose --url http://x:1 --out o --no-such-flag", "--no-such-flag"),
        ("llmb-loadgen diagnos --url http://x:1", "diagnos"),
        ("llmb-loadgen run --config config.yaml --engine sglang", "--engine sglang"),
        ("llmb-loadgen diagnose --config config.yaml --engine llama", "--out"),
        ("docker compose --profile hots up -d", "hots"),
        (
            "docker compose --profile loadgen run --rm --entrypoint llmb-loadgen loadgen "
            "diagnose --config /etc/llmb/config.yaml --engine llama",
            "--out",
        ),
        ("make tests", "tests"),
        ("llmb-sim --kind llamacpp --scenario healthy [--bogus]", "--bogus"),
    ],
)
def test_the_check_catches_what_does_not_exist(text: str, problem: str) -> None:
    for whole in (True,):
        problems = check(Line("test", text, whole))
        assert any(problem in p for p in problems), problems


def test_every_flag_of_every_command_is_in_the_docs() -> None:
    """The other way round: a flag `--help` shows that no page names (the exporter's
    `--listen` and `--log-level` were in no page). One spelling of a flag is enough."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in DOCS)
    named = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w.-]*)", text))
    missing = []
    for script, make in PARSERS.items():
        top = make()
        parsers = [top, *_options(top)[1].values()]
        for action in (a for p in parsers for a in p._actions):
            spellings = set(action.option_strings) - {"-h", "--help"}
            if spellings and not spellings & named:
                missing.append(f"{script} {'/'.join(sorted(spellings))}")
    assert missing == []
