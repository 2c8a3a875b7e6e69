"""Developer tools, not imported by the product: the synthetic-model writer (`llmb-synth-model`),
the GPU-run report, the fuzz mutators."""
