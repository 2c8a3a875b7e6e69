"""llm-bottleneck exporter: GPU memory (NVML) and llama.cpp / SGLang metrics in one schema."""

__version__ = "0.1.0"
