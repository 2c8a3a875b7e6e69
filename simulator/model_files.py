"""The model files a simulated engine serves as its `model_path`.

A real llama-server names the GGUF it loaded in `/props` `model_path`, and SGLang names its HF
model folder in `/server_info`; the exporter and `diagnose` read the model's geometry from
there (layers, KV heads, experts, tensor sizes). A preset with a real shape writes that file:
llama.cpp a header-only GGUF from `llmb-synth-model`'s plan (every tensor's name, shape and
type, no data), SGLang a folder with the model's `config.json`. Presets without a shape keep a
made-up path that readers cannot open, as before.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

from config.kinds import engine_kind
from simulator.model import ModelSpec

LOG = logging.getLogger("llmb-sim")


class ModelFiles:
    """A temporary folder holding the served model file (removed with this object)."""

    def __init__(self, kind: str, model: ModelSpec) -> None:
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self.path = model.name
        # The kind's model layout (config/kinds.py): a GGUF file or an HF folder.
        layout = engine_kind(kind).model_layout
        if layout == "file" and model.gguf_like is not None:
            self.path = self._write_gguf(model) or model.name
        elif layout == "folder" and model.hf_config is not None:
            self.path = str(self._write_hf(model))

    def _folder(self) -> Path:
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="llmb-sim-model-")
        return Path(self._dir.name)

    def _write_gguf(self, model: ModelSpec) -> str | None:
        assert model.gguf_like is not None
        try:  # the GGUF writer is an extra (llm-bottleneck[synth]: gguf, numpy)
            from tools.synth_model.gguf_file import write_header_only
            from tools.synth_model.plan import build_model
        except ImportError as exc:
            LOG.warning("no GGUF for %s (%s): install llm-bottleneck[synth]", model.name, exc)
            return None
        like, wtype = model.gguf_like
        out = self._folder() / Path(model.name).name
        write_header_only(build_model(like, wtype, None), out)
        return str(out)

    def _write_hf(self, model: ModelSpec) -> Path:
        folder = self._folder() / Path(model.name).stem
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(model.hf_config, indent=2) + "\n")
        return folder

    def close(self) -> None:
        """Remove the folder."""
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
