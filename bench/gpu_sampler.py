"""Record an engine's raw endpoints while a GPU run goes on (bench/gpu_pipeline.sh).

usage: python bench/gpu_sampler.py PORT DIR [--every S]

/slots every S seconds, /metrics, /props (llama.cpp) or /server_info (SGLang) every 5 S, each
answer with its time: slots-PORT.jsonl, props-PORT.jsonl and metrics-PORT.txt in DIR. A server
that is down or restarting is recorded as null and the loop goes on until it is killed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import httpx


def _get(client: httpx.Client, url: str) -> httpx.Response | None:
    try:
        resp = client.get(url)
    except httpx.HTTPError:
        return None
    return resp if resp.status_code == 200 else None


def _json(resp: httpx.Response | None) -> object:
    if resp is None:
        return None
    try:
        return resp.json()
    except ValueError:
        return resp.text


def main(argv: list[str] | None = None) -> None:
    """Sample until killed."""
    ap = argparse.ArgumentParser(prog="gpu_sampler.py")
    ap.add_argument("port", type=int)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--every", type=float, default=2.0)
    a = ap.parse_args(argv)
    a.dir.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{a.port}"
    i = 0
    with httpx.Client(timeout=2.0) as client:
        while True:
            t = time.time()
            with (a.dir / f"slots-{a.port}.jsonl").open("a") as fh:
                fh.write(json.dumps({"t": t, "slots": _json(_get(client, base + "/slots"))}) + "\n")
            if i % 5 == 0:
                metrics = _get(client, base + "/metrics")
                with (a.dir / f"metrics-{a.port}.txt").open("a") as fh:
                    fh.write(f"# t={t}\n" + (metrics.text if metrics is not None else "") + "\n")
                props = _json(_get(client, base + "/props")) or _json(
                    _get(client, base + "/server_info")
                )
                with (a.dir / f"props-{a.port}.jsonl").open("a") as fh:
                    fh.write(json.dumps({"t": t, "props": props}) + "\n")
            i += 1
            time.sleep(max(0.0, a.every - (time.time() - t)))


if __name__ == "__main__":
    main()
