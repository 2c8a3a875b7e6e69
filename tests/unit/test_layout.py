"""The layout's contracts, read from the source: sizes, and which package may import which.

A module over ~500 lines or a function over 80 is where a newcomer gets lost (every product
package and tools/ are held to it); `loadgen` is
below `diagnose` (diagnose drives the load generator, never the other way round, except
the one command line that registers every subcommand), and the exporter's internals are
read through one seam, `loadgen.exporter_series`.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from tests.paths import ROOT

MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
# The packages held to the sizes: every product package and the developer tools.
SIZED = ("cli", "config", "core", "diagnose", "exporter", "loadgen", "mixin", "model", "simulator")
SIZED += ("tools",)
# Exporter internals that only the one seam (loadgen/exporter_series.py) imports.
EXPORTER_INTERNALS = (
    "exporter.app",
    "exporter.runner",
    "exporter.promtext",
    "exporter.collectors",
    "pynvml",
)
SEAM = "loadgen/exporter_series.py"


def _modules(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


def _imports(path: Path, runtime_only: bool = False) -> set[str]:
    """The absolute imports of `path`; with `runtime_only`, not those under `if
    TYPE_CHECKING:` (annotations only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if runtime_only and isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for n in ast.walk(block)
    }
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _oversized(path: Path) -> list[str]:
    """The file itself when over MAX_FILE_LINES, and each function over MAX_FUNCTION_LINES."""
    text = path.read_text(encoding="utf-8")
    found = []
    if (lines := len(text.splitlines())) > MAX_FILE_LINES:
        found.append(f"{_rel(path)}: {lines} lines")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{_rel(path)}:{node.lineno} {node.name}: {length} lines")
    return found


@pytest.mark.parametrize("package", SIZED)
def test_no_file_over_500_lines_and_no_function_over_80(package: str) -> None:
    too_long = [finding for path in _modules(package) for finding in _oversized(path)]
    assert not too_long, "\n".join(too_long)


def test_the_size_check_sees_a_long_function_and_a_long_file(monkeypatch, tmp_path: Path) -> None:
    """A function one line over the limit is found (its body counted whole, nested or not),
    one at the limit is not; a file one line over the limit is found."""
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    planted = tmp_path / "planted.py"
    planted.write_text(f"class C:\n    async def long(self):\n{body}\n        y = 0\n")
    assert _oversized(planted) == [f"planted.py:2 long: {MAX_FUNCTION_LINES + 1} lines"]
    planted.write_text(f"def fits():\n{body.replace('        ', '    ')}\n")
    assert _oversized(planted) == []
    planted.write_text("x = 1\n" * (MAX_FILE_LINES + 1))
    assert _oversized(planted) == [f"planted.py: {MAX_FILE_LINES + 1} lines"]
    planted.write_text("x = 1\n" * MAX_FILE_LINES)
    assert _oversized(planted) == []


# The floors: a module imports only packages on its own floor or below (docs/architecture.md).
FLOORS: dict[str, int] = {
    "core": 0,
    "config": 0,
    "model": 0,
    "exporter": 1,
    "loadgen": 2,
    "diagnose": 3,
    "mixin": 4,
    "tools": 4,
    "simulator": 5,  # writes same-shape GGUF files with tools.synth_model
    "cli": 6,
}
# Ground-floor packages import nothing of ours but their own floor-mates named here: the rule
# arithmetic reads the engine registry (config/kinds.py), as the mixin's rules do.
GROUND_IMPORTS = {"core": {"config"}, "model": set(), "config": set()}


def _climbs(path: Path, own: str = "") -> list[str]:
    """The imports of `path` that reach a package on a higher floor than its own."""
    own = own or _rel(path).split("/")[0]
    return sorted(m for m in _imports(path) if FLOORS.get(m.split(".")[0], -1) > FLOORS[own])


@pytest.mark.parametrize("package", sorted(FLOORS))
def test_no_import_climbs_a_floor(package: str) -> None:
    bad = [f"{_rel(p)}: {_climbs(p)}" for p in _modules(package) if _climbs(p)]
    assert not bad, "\n".join(bad)


def test_the_floor_check_sees_a_climb(tmp_path: Path) -> None:
    """A loadgen module importing diagnose is a climb; one importing core is not."""
    fake = tmp_path / "probe.py"
    fake.write_text("import core\nfrom diagnose.cli import DIAGNOSE\n", encoding="utf-8")
    assert _climbs(fake, own="loadgen") == ["diagnose.cli", "diagnose.cli.DIAGNOSE"]
    assert _climbs(fake, own="diagnose") == []


@pytest.mark.parametrize("package", sorted(GROUND_IMPORTS))
def test_the_ground_floor_imports_nothing_of_ours(package: str) -> None:
    ours = set(FLOORS) - {package} - GROUND_IMPORTS[package]
    bad = [_rel(p) for p in _modules(package) if any(m.split(".")[0] in ours for m in _imports(p))]
    assert not bad


def test_config_and_model_are_not_read_through_the_exporter() -> None:
    """The config and the model geometry live on the ground floor, not under exporter/."""
    assert not (ROOT / "exporter" / "config.py").exists()
    assert not (ROOT / "exporter" / "model").exists()


def test_exporter_internals_are_read_through_one_seam() -> None:
    """diagnose and loadgen reach the exporter's runner, parser, collectors and NVML only
    through loadgen/exporter_series.py (they may use its config types and model geometry)."""
    bad = []
    for path in _modules("loadgen", "diagnose"):
        if _rel(path) == SEAM:
            continue
        hits = sorted(
            m
            for m in _imports(path)
            if any(m == i or m.startswith(i + ".") for i in EXPORTER_INTERNALS)
        )
        if hits:
            bad.append(f"{_rel(path)}: {hits}")
    assert not bad, "\n".join(bad)
    assert "exporter.app.build_runner" in _imports(ROOT / SEAM)


def test_nothing_climbs_back_into_the_command_line() -> None:
    """The subcommand modules (loadgen/cli.py, diagnose/cli.py) are imported by the
    composition root only: the procedure, its steps and the monitor never reach back up."""
    importers = {
        _rel(p): sorted(m for m in _imports(p) if m in ("diagnose.cli", "loadgen.cli"))
        for p in _modules(*FLOORS)
    }
    assert {path for path, hits in importers.items() if hits} == {"cli/loadgen.py"}
    assert importers["cli/loadgen.py"] == ["diagnose.cli", "loadgen.cli"]


# No facades: a package's __init__ names where things live; it re-exports at most a few.
MAX_REEXPORTS = 10


def _reexports(path: Path) -> set[str]:
    """The names a package's `__init__.py` imports only to hand on (unused in its own code),
    and every name its `__all__` lists."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported: set[str] = set()
    listed: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            imported.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            imported.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            listed.update(ast.literal_eval(node.value))
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return (imported - used) | listed


def test_no_package_init_is_a_facade() -> None:
    inits = [p for p in _modules(*FLOORS) if p.name == "__init__.py"]
    assert len(inits) > 10, inits
    big = {_rel(p): len(n) for p in inits if len(n := _reexports(p)) > MAX_REEXPORTS}
    assert not big, big


def test_the_facade_check_counts_reexports(tmp_path: Path) -> None:
    init = tmp_path / "__init__.py"
    init.write_text(
        '"""doc"""\nfrom __future__ import annotations\n\nfrom a.b import c, d as e, k\n'
        'import f.g\n__all__ = ["c", "h"]\nx = k(1)\n',
        encoding="utf-8",
    )
    assert _reexports(init) == {"c", "e", "f", "h"}


def _names_used(paths: list[Path]) -> set[str]:
    """Every identifier the modules at `paths` import, read or reach as an attribute."""
    used: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.alias):
                used.add((node.asname or node.name).split(".")[-1])
    return used


def test_core_exports_only_what_is_used_outside_core() -> None:
    """`core/__init__` exports no name that nothing outside core (product or tests) uses."""
    exported = _reexports(ROOT / "core" / "__init__.py")
    outside = [p for p in _modules(*FLOORS, "tests", "bench") if _rel(p).split("/")[0] != "core"]
    unused = sorted(exported - _names_used(outside))
    assert not unused, unused
    # The scan sees names used outside core: the evaluator is.
    assert "evaluate" in _names_used(outside)


# --- every path a comment or a doc names exists ----------------------------------------------

# A path of this repository: a top-level folder of ours, then a file name with an extension or
# a folder ending in "/"; "../" resolves from the doc's own folder (Markdown links). Not one:
# a path inside a longer one (`vllm/docs/x.md`, `/usr/lib/...`), a pattern (`<kind>`,
# `{name}`, `*.yml`, `...`) or a placeholder segment in capitals (`tests/fixtures/RUN`).
_TOP = "bench|cli|config|core|deploy|diagnose|docs|exporter|grafana|loadgen|mixin|model"
_TOP += "|prometheus|scripts|simulator|tests|tools"
_PATH = re.compile(rf"(?<![\w/.\-~$])((?:\.\./)*)((?:{_TOP})/[\w.\-/<>{{}}*]*)")
_PATTERN = re.compile(r"[<>{}*]|\.\.\.|/[A-Z_]+(?:/|$)")
# Paths that are not this repository's, by the doc that names them and why.
NOT_OURS = {
    ("docs/engines.md", "docs/design/metrics.md"): "vLLM's repository",
    ("docs/engines.md", "exporter/collectors/vllm/metrics.py"): "the worked example, not built",
}
# The product's packages and tools: their comments and docstrings are checked.
DOCUMENTED = SIZED


def named_paths(text: str) -> list[str]:
    """The repository paths `text` names, as written ("../" kept)."""
    out = []
    for match in _PATH.finditer(text):
        up, path = match.group(1), match.group(2).rstrip(".-")
        if _PATTERN.search(path):
            continue
        if path.endswith("/") or re.search(r"\.\w+$", path.rsplit("/", 1)[-1]):
            out.append(up + path)
    return out


def _prose(path: Path) -> list[str]:
    """A Python file's comments and docstrings; a Markdown file's whole text."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        return [text]
    found = [
        tok.string
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(ast.get_docstring(node, clean=False) or "")
    return found


def missing_paths(files: list[Path], root: Path) -> list[str]:
    """`FILE: PATH` for each path named in `files`' prose that does not exist under `root`."""
    missing = []
    for path in files:
        where = path.relative_to(root).as_posix()
        for text in _prose(path):
            for named in named_paths(text):
                base = path.parent if named.startswith("../") else root
                if (where, named) not in NOT_OURS and not (base / named).exists():
                    missing.append(f"{where}: {named}")
    return missing


def test_every_path_named_in_a_comment_or_doc_exists() -> None:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # not docs/results/
    files = _modules(*DOCUMENTED) + docs
    missing = missing_paths(files, ROOT)
    assert not missing, "\n".join(missing)
    named = {
        (f.relative_to(ROOT).as_posix(), p) for f in docs for t in _prose(f) for p in named_paths(t)
    }
    assert set(NOT_OURS) <= named, "an exception no doc needs any more"


def test_the_path_check_sees_a_planted_bad_path(tmp_path: Path) -> None:
    (tmp_path / "core").mkdir()
    (tmp_path / "docs").mkdir()
    real = tmp_path / "core" / "real.py"
    real.write_text(
        '"""Read by tests/unit/test_gone.py."""\n'
        "# see core/real.py and core/ and docs/x.md\n"
        'HELP = "tests/unit/test_not_prose.py is a string, not prose"\n'
    )
    doc = tmp_path / "docs" / "x.md"
    doc.write_text(
        "[here](../core/real.py), [gone](../core/gone.py), `tests/fixtures/<kind>/`, "
        "`prometheus/rules/*.yml`, `tests/fixtures/RUN`, vendor/docs/y.md, diagnose/compare\n"
    )
    assert missing_paths([real, doc], tmp_path) == [
        "core/real.py: tests/unit/test_gone.py",
        "docs/x.md: ../core/gone.py",
    ]


# diagnose/ is at most this many layers deep (docs/architecture.md, "The diagnose path").
DIAGNOSE_LAYERS = 7


def _layers(package: str) -> dict[str, int]:
    """Each module's layer: 1 + the highest layer among the package modules it imports."""
    deps = {}
    for path in _modules(package):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        deps[name] = _imports(path, runtime_only=True)
    deps = {m: {d for d in ds if d in deps and d != m} for m, ds in deps.items()}
    layer: dict[str, int] = {}

    def depth(m: str, seen: tuple[str, ...] = ()) -> int:
        assert m not in seen, f"import cycle: {' -> '.join((*seen, m))}"
        if m not in layer:
            layer[m] = 1 + max((depth(d, (*seen, m)) for d in deps[m]), default=0)
        return layer[m]

    for m in deps:
        depth(m)
    return layer


def test_diagnose_is_at_most_seven_layers_deep() -> None:
    layers = _layers("diagnose")
    assert layers["diagnose.cli"] == max(layers.values()) <= DIAGNOSE_LAYERS, layers
    # The steps get values and measuring seams (diagnose/step_inputs.py), not the run's
    # object nor the measuring chain.
    measuring = {"diagnose.load", "diagnose.facts", "diagnose.evidence", "diagnose.engine_run"}
    for step in ("single", "concurrency", "kv", "context", "residency"):
        reached = _imports(ROOT / "diagnose" / "steps" / f"{step}.py", runtime_only=True)
        assert not reached & measuring, step
        assert layers[f"diagnose.steps.{step}"] < layers["diagnose.load"]


# Loops between files, counting imports under `if TYPE_CHECKING:` and inside functions: a
# loop held together by either is still two files that cannot be read one before the other.
# What is left to untangle (issue 35); the list only shrinks.
KNOWN_LOOPS: set[frozenset[str]] = set()


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _file_imports(path: Path, name: str) -> set[str]:
    """Every module `path` imports anywhere in it (relative imports resolved)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def file_loops(root: Path, packages: tuple[str, ...]) -> list[set[str]]:
    """The import loops between modules of `packages` under `root` (each loop's modules)."""
    paths = {_module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}

    def owner(imported: str) -> str | None:
        while imported and imported not in paths:
            imported = imported.rpartition(".")[0]
        return imported or None

    edges = {
        name: {
            m
            for i in _file_imports(path, name)
            if (m := owner(i)) and m != name and not name.startswith(f"{m}.")
        }
        for name, path in paths.items()
    }
    # Tarjan's strongly connected components: each one of more than one module is a loop.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = {stack.pop()}
            while v not in component:
                component.add(stack.pop())
            if len(component) > 1:
                loops.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return loops


def test_no_import_loop_between_files() -> None:
    loops = {frozenset(loop) for loop in file_loops(ROOT, SIZED)}
    assert not loops - KNOWN_LOOPS, sorted(sorted(loop) for loop in loops - KNOWN_LOOPS)
    # A loop untangled leaves this list too.
    assert not KNOWN_LOOPS - loops, sorted(sorted(loop) for loop in KNOWN_LOOPS - loops)


def test_the_loop_check_sees_a_loop_held_by_type_checking_or_a_function(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import B\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n"
    )
    (pkg / "c.py").write_text("def f():\n    from pkg import d\n")
    (pkg / "d.py").write_text("import pkg.c\n")
    (pkg / "e.py").write_text("from pkg import a\n")
    loops = sorted(sorted(loop) for loop in file_loops(tmp_path, ("pkg",)))
    assert loops == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]
