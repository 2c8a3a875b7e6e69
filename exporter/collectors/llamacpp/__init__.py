"""llama-server: the collector (/metrics, /slots, /props, GGUF) and its log follower and parsers."""
