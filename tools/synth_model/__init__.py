"""`llmb-synth-model`: same-shape GGUF models, real tensor shapes and metadata, random weights.

A 27B model costs a 54 GB download to measure a card's decode speed and memory; the speed and the
memory depend only on the tensor shapes and the weight type, not on the values. This tool writes a
GGUF with exactly the shapes llama.cpp expects for a chosen architecture, random weights in Q4_0,
Q8_0 or F16, and the tokenizer of any small GGUF of the same family. The text it generates is
nonsense; compute, bandwidth and memory are those of the real model.

Modules: `shapes` (the published architectures and the tensors each has), `metadata` (GGUF
keys and tokenizers), `plan` (a model to write: shape, tensors, metadata, weight bytes),
`gguf_file` (writing the file: header, index, random weight blocks), `cli` (the command).
"""
