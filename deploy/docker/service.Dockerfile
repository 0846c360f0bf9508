# One image per service: docker build -f deploy/docker/service.Dockerfile --build-arg SERVICE=kvbench-planner .
FROM python:3.11-slim
ARG SERVICE
ENV UV_PROJECT_ENVIRONMENT=/opt/venv PATH=/opt/venv/bin:$PATH
RUN pip install --no-cache-dir uv
WORKDIR /src
COPY . .
RUN uv sync --locked --no-dev --package "$SERVICE"
ENV SERVICE_MODULE=""
CMD ["sh", "-c", "python -m ${SERVICE_MODULE}"]
