# syntax=docker/dockerfile:1
# One image per service: docker build -f deploy/docker/service.Dockerfile --build-arg SERVICE=kvbench-planner .
# The node agent's image also holds the Docker CLI: its docker launcher runs `docker run` against the host's daemon
# through the mounted socket (deploy/compose/agent.yaml). Docker's own static CLI, pinned, taken from its image at
# build time; the other services' images go without it.
# BASE: the image it is built on. An agent that starts engines inside its own pod (Kubernetes, the process launcher)
# is built on the engines' image, e.g. --build-arg BASE=vllm/vllm-openai:v0.28.0 (docs/cluster.md, "On Kubernetes").
ARG BASE=python:3.11-slim
FROM docker:28.2.2-cli AS docker-cli
FROM ghcr.io/astral-sh/uv:0.13.9 AS uv

FROM ${BASE}
ARG SERVICE
# kvbench's own environment comes last on PATH: on an engine's image, `python3`, `vllm` and the like stay the engine's
ENV UV_PROJECT_ENVIRONMENT=/opt/venv PATH=$PATH:/opt/venv/bin
RUN --mount=type=bind,from=docker-cli,source=/usr/local/bin/docker,target=/tmp/docker-cli \
    if [ "$SERVICE" = "kvbench-node-agent" ]; then install -m 0755 /tmp/docker-cli /usr/local/bin/docker; fi
# uv as a binary, pinned (the version `make env` uses): a base image's own pip may refuse installs (PEP 668)
COPY --from=uv /uv /usr/local/bin/uv
WORKDIR /src
COPY . .
RUN uv sync --locked --no-dev --package "$SERVICE"
ENV SERVICE_MODULE=""
CMD ["sh", "-c", "exec /opt/venv/bin/python -m ${SERVICE_MODULE}"]
