# syntax=docker/dockerfile:1
# One image per service: docker build -f deploy/docker/service.Dockerfile --build-arg SERVICE=kvbench-planner .
# The node agent's image also holds the Docker CLI: its docker launcher runs `docker run` against the host's daemon
# through the mounted socket (deploy/compose/agent.yaml). Docker's own static CLI, pinned, taken from its image at
# build time; the other services' images go without it.
FROM docker:28.2.2-cli AS docker-cli

FROM python:3.11-slim
ARG SERVICE
ENV UV_PROJECT_ENVIRONMENT=/opt/venv PATH=/opt/venv/bin:$PATH
RUN --mount=type=bind,from=docker-cli,source=/usr/local/bin/docker,target=/tmp/docker-cli \
    if [ "$SERVICE" = "kvbench-node-agent" ]; then install -m 0755 /tmp/docker-cli /usr/local/bin/docker; fi
RUN pip install --no-cache-dir uv
WORKDIR /src
COPY . .
RUN uv sync --locked --no-dev --package "$SERVICE"
ENV SERVICE_MODULE=""
CMD ["sh", "-c", "python -m ${SERVICE_MODULE}"]
