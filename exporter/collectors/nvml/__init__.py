"""NVML: the GPU collector and the pynvml backend behind its seam."""
