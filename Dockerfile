# The project image: exporter (llmb-exporter), load generator (llmb-loadgen) and the engine
# simulators (llmb-sim). Used by the exporter, loadgen and demo services of docker-compose.yml.
FROM python:3.12.7-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY . /src
RUN pip install /src \
    && rm -rf /src \
    && useradd --system --uid 10001 --create-home --home-dir /home/llmb --shell /usr/sbin/nologin llmb

WORKDIR /home/llmb
# Non-root: NVML needs only the device nodes the NVIDIA runtime mounts, and the command
# lines of other processes under `pid: host` are world-readable.
USER 10001
EXPOSE 9490 9491
CMD ["llmb-exporter", "--config", "/etc/llmb/config.yaml"]
