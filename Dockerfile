# The llm-gateway image: the gateway (`llm-gateway serve`, or `llm-gateway epp` behind Envoy)
# and, from the same image, the simulated vLLM replica (`llm-gateway sim-replica`) that
# docker-compose.yml runs without GPUs.
#   docker build -t llm-gateway:0.1.0 .
#   docker run -p 8080:8080 -v $PWD/my-policy.yaml:/etc/llm-gateway/policy.yaml:ro llm-gateway:0.1.0
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what `pip install .` needs: the packaging metadata and the product's three packages.
# The tooling (bench/: demo, benchmarks) stays out of the production image;
# tests/test_wheel_install.py installs exactly these COPY lines into a fresh virtualenv.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY router_policies ./router_policies
COPY replica ./replica
# The same image runs `llm-gateway epp` (the endpoint picker behind Envoy) and sends traces
# when GATEWAY_OTEL=true: both are in the base dependencies.
RUN pip install . && rm -rf /src

RUN groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid gateway --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin gateway
WORKDIR /
USER 10001:10001

# Inside a container loopback is useless: listen on every address. The policy is mounted here
# (the Helm chart mounts its ConfigMap; compose mounts deploy/compose-policy.yaml).
ENV GATEWAY_HOST=0.0.0.0 \
    GATEWAY_PORT=8080 \
    GATEWAY_POLICY=/etc/llm-gateway/policy.yaml
EXPOSE 8080

ENTRYPOINT ["llm-gateway"]
CMD ["serve", "--policy", "/etc/llm-gateway/policy.yaml"]
