# Prometheus and Alertmanager from Debian's packages, for the system test of the compose
# stack where no registry is reachable (tests/test_docker_stack.py substitutes these for
# prom/prometheus and prom/alertmanager). BASE_IMAGE: scripts/install-docker.sh's base.
ARG BASE_IMAGE
FROM ${BASE_IMAGE} AS debian-prometheus
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
       prometheus prometheus-alertmanager >/dev/null \
    && rm -rf /var/lib/apt/lists/*

FROM debian-prometheus AS prometheus
WORKDIR /prometheus
ENTRYPOINT ["/usr/bin/prometheus"]

FROM debian-prometheus AS alertmanager
WORKDIR /alertmanager
ENTRYPOINT ["/usr/bin/prometheus-alertmanager"]
