# Two images from one file (docker-compose.yml builds both):
#   --target exporter  llmb-exporter only: the base dependencies, no plotting stack, no
#                      numpy (it runs on every GPU host; size in docs/deploy.md)
#   --target full      the load generator with its HTML report, the simulators, the
#                      GGUF writer (extras [full]); the loadgen and demo services
# The exporter stage comes first: a builder without BuildKit builds every stage up to its
# --target, so the exporter's image never waits for numpy and matplotlib.
#
# BASE_IMAGE: any Debian-like image with python3 (>= 3.10) and its venv module, e.g. one
# imported from debootstrap where no registry is reachable (docs/deploy.md, "Tested on").
# constraints.txt pins every dependency, so two builds of one commit install the same.
ARG BASE_IMAGE=python:3.12.7-slim-bookworm
FROM ${BASE_IMAGE} AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/llmb/bin:$PATH
# Non-root: NVML needs only the device nodes the NVIDIA runtime mounts, and the command
# lines of other processes under `pid: host` are world-readable.
# /home/llmb/link: the compose host profile's socket volume, created owned by llmb.
RUN useradd --system --uid 10001 --create-home --home-dir /home/llmb --shell /usr/sbin/nologin llmb \
    && install -d -o llmb -g llmb /home/llmb/link \
    && python3 -m venv /opt/llmb
WORKDIR /src
COPY constraints.txt pyproject.toml README.md /src/
COPY core /src/core
COPY config /src/config
COPY model /src/model
COPY cli /src/cli
COPY exporter /src/exporter
COPY loadgen /src/loadgen
COPY diagnose /src/diagnose
COPY simulator /src/simulator
COPY tools /src/tools

FROM base AS exporter
RUN pip install -c /src/constraints.txt /src && rm -rf /src
WORKDIR /home/llmb
USER 10001
EXPOSE 9490
CMD ["llmb-exporter", "--config", "/etc/llmb/config.yaml"]

FROM base AS full
RUN pip install -c /src/constraints.txt "/src[full]" && rm -rf /src
WORKDIR /home/llmb
USER 10001
EXPOSE 9490 9491
CMD ["llmb-exporter", "--config", "/etc/llmb/config.yaml"]
