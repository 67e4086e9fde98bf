# Serves an environment from envs/ on port 8000, with openenv installed from this checkout:
#   docker build -t echo_env .                                   # envs/echo_env (the default)
#   docker build --build-arg ENV_NAME=my_env -t my_env .         # envs/my_env
#   docker run -p 8000:8000 -e OPENENV_MAX_CONCURRENT_ENVS=256 echo_env
FROM python:3.11-slim

ARG ENV_NAME=echo_env
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UVICORN_HOST=0.0.0.0 \
    UVICORN_PORT=8000 \
    UVICORN_WS=openenv.server.wsprotocol:WebSocketProtocol \
    UVICORN_HTTP=openenv.server.httpprotocol:HttpToolsProtocol

WORKDIR /app
COPY pyproject.toml README.md ./
COPY src ./src
COPY templates ./templates
COPY envs/${ENV_NAME} ./env
RUN pip install --no-cache-dir . ./env

WORKDIR /app/env
USER 10001
EXPOSE 8000
# The slim image has no curl; Python is there anyway.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ['UVICORN_PORT'] + '/health', timeout=4)"]
# uvicorn is PID 1 and reads UVICORN_HOST / UVICORN_PORT / UVICORN_WS (openenv's fast
# WebSocket protocol) / UVICORN_HTTP (openenv's HTTP protocol: a client's request headers
# must end within OPENENV_HEADER_TIMEOUT); SIGTERM stops it cleanly.
CMD ["uvicorn", "server.app:app"]
