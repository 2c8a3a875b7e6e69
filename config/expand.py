"""`${VAR}` in a config file's values, read from the environment as compose reads `.env`.

One config serves every host: `url: "${LLAMACPP_URL:-}"` names the engine the user set in
`.env`, and an engine whose `url` comes out empty is not there (it is left out, so no
`LLMEngineDown` fires for it). The forms are compose's:

* `${VAR}` and `${VAR:-default}`: the value, or `default` (empty) when VAR is unset or empty;
* `${VAR:+alternative}`: `alternative` when VAR is set and not empty, else empty;
* `$$` is a literal `$`.

A key whose value was only `${...}` and came out empty is removed, so an optional path
(`log_file`, `model_path`) left empty in `.env` is simply not configured.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:-|:\+)([^}]*))?\}")


def expand_text(text: str, environ: Mapping[str, str]) -> str:
    """`text` with every `${VAR...}` replaced from `environ` (compose's rules)."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        value = environ.get(match.group(1), "")
        op, word = match.group(2), match.group(3) or ""
        if op == ":+":
            return word if value else ""
        return value or (word if op == ":-" else "")

    return _VAR.sub(one, text)


def expand_config(data: Any, environ: Mapping[str, str]) -> Any:
    """The loaded YAML with its values expanded; engines whose url came out empty dropped."""
    data = _expand(data, environ)
    if isinstance(data, dict) and isinstance(data.get("engines"), list):
        data["engines"] = [
            e for e in data["engines"] if not (isinstance(e, dict) and e.get("url") is _UNSET)
        ]
    return _strip_unset(data)


class _Unset:
    """A value that was only `${...}` and expanded to nothing."""


_UNSET = _Unset()


def _expand(value: Any, environ: Mapping[str, str], done: dict[int, Any] | None = None) -> Any:
    # YAML aliases share one object: expand each container once (`done`), so a file of
    # nested aliases costs its size here too, not its expansion.
    if isinstance(value, str) and "$" in value:
        expanded = expand_text(value, environ)
        return _UNSET if expanded == "" and _VAR.fullmatch(value.strip()) else expanded
    if not isinstance(value, (dict, list)):
        return value
    done = {} if done is None else done
    if id(value) not in done:
        if isinstance(value, dict):
            done[id(value)] = {k: _expand(v, environ, done) for k, v in value.items()}
        else:
            done[id(value)] = [_expand(v, environ, done) for v in value]
    return done[id(value)]


def _strip_unset(value: Any, done: set[int] | None = None) -> Any:
    """Remove the unset values in place (each shared container once)."""
    done = set() if done is None else done
    if isinstance(value, (dict, list)) and id(value) not in done:
        done.add(id(value))
        if isinstance(value, dict):
            for key in [k for k, v in value.items() if v is _UNSET]:
                del value[key]
            children: Any = value.values()
        else:
            value[:] = [v for v in value if v is not _UNSET]
            children = value
        for child in children:
            _strip_unset(child, done)
    return value
