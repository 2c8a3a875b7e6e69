"""llm-bottleneck load generator."""
