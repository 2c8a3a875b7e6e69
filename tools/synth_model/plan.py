"""A model to write: its shape, tensors and metadata, and the weight bytes a step reads."""

from __future__ import annotations

from dataclasses import dataclass, replace

from core.roofline import ModelStructure, active_weights_bytes
from model.weights import TensorInfo, WeightSplit, split_tensors
from tools.synth_model.metadata import KV, fit_tokenizer, model_metadata
from tools.synth_model.shapes import (
    EXPERT_TYPES,
    SPECS,
    WEIGHT_TYPES,
    ArchSpec,
    SynthError,
    TensorPlan,
    plan_tensors,
)


@dataclass(frozen=True)
class Model:
    """Everything needed to write (or describe) one synthetic GGUF."""

    like: str
    wname: str
    spec: ArchSpec
    tensors: list[TensorPlan]
    metadata: dict[str, KV]

    @property
    def n_params(self) -> int:
        """Parameter count as llama.cpp reports it (`n_params` in /v1/models)."""
        return sum(t.n_elements for t in self.tensors)

    @property
    def data_bytes(self) -> int:
        """Sum of tensor sizes (llama.cpp's `size` in /v1/models)."""
        return sum(t.nbytes for t in self.tensors)


def weight_split(model: Model) -> WeightSplit:
    """The planned tensors split as the exporter splits a GGUF's (model.weights)."""
    tensors = [
        TensorInfo(t.name, t.nbytes, model.spec.n_vocab if t.name == "token_embd.weight" else 1)
        for t in model.tensors
    ]
    return split_tensors(tensors, model.spec.n_layer)


def weights_step_bytes(model: Model, batch: int = 1) -> float:
    """Expected weight bytes a decode step of `batch` sequences reads: the decision core's
    formula (always-read + routed x (1 - (1 - k/E)^B) + B x embedding row)."""
    split, s = weight_split(model), model.spec
    structure = ModelStructure(
        weights_bytes=model.data_bytes,
        always_read_bytes=split.always_read_bytes,
        routed_expert_bytes=split.routed_expert_bytes,
        experts=s.n_expert or None,
        experts_used=s.n_expert_used or None,
        token_embedding_row_bytes=split.token_embedding_row_bytes,
    )
    return active_weights_bytes(structure, batch)


def make_model(spec: ArchSpec, like: str, wname: str, tokenizer: dict[str, KV] | None) -> Model:
    """Plan a model of any shape, with a tokenizer fitted to its vocabulary."""
    metadata = model_metadata(spec, like, wname)
    if tokenizer is not None:
        metadata.update(fit_tokenizer(tokenizer, spec, like))
    tensors = plan_tensors(spec, WEIGHT_TYPES[wname][0])
    return Model(like, wname, spec, tensors, metadata)


def build_model(
    like: str,
    wname: str,
    tokenizer: dict[str, KV] | None,
    layers: int | None = None,
    ctx_train: int | None = None,
    expert_type: str | None = None,
) -> Model:
    """Plan a model: the named shape, optionally shallower, with a tokenizer fitted to it.

    `expert_type` sets the weight type of routed experts (default: the shape's own, e.g. MXFP4
    for gpt-oss, else `wname`).
    """
    if like not in SPECS:
        raise SynthError(f"unknown --like {like!r}; known: {', '.join(SPECS)}")
    if wname not in WEIGHT_TYPES:
        raise SynthError(f"unknown --type {wname!r}; known: {', '.join(WEIGHT_TYPES)}")
    spec = SPECS[like]
    if expert_type is not None:
        if not spec.is_moe:
            raise SynthError(f"--expert-type: {like} has no experts")
        if expert_type not in EXPERT_TYPES:
            raise SynthError(
                f"unknown --expert-type {expert_type!r}; known: {', '.join(EXPERT_TYPES)}"
            )
    if spec.is_moe:
        spec = replace(spec, expert_type=expert_type or spec.expert_type or wname)
    if layers is not None:
        if layers < 1:
            raise SynthError("--layers must be at least 1")
        spec = replace(spec, n_layer=layers)
    if ctx_train is not None:
        if ctx_train < 1:
            raise SynthError("--ctx-train must be at least 1")
        spec = replace(spec, ctx_train=ctx_train)
    return make_model(spec, like, wname, tokenizer)
