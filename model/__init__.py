"""The model side: GGUF/HF geometry, ggml types, weight bytes by role, GPU specs."""
