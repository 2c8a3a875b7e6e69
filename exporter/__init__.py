"""llm-bottleneck exporter: GPU memory (NVML) and llama.cpp / SGLang metrics in one schema."""

from __future__ import annotations

import argparse
from typing import Any

__version__ = "0.1.0"


def versioned_parser(prog: str, description: str, **kwargs: Any) -> argparse.ArgumentParser:
    """The parser of one of the project's commands, `--version` its first option."""
    parser = argparse.ArgumentParser(prog=prog, description=description, **kwargs)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser
