# The execgate daemon. Build: docker build -t execgate .
# Run (Unix socket in a volume, the default and the safe choice):
#   docker run -v execgate-state:/var/lib/execgate -v "$PWD/workspace:/workspace" execgate
# TCP (no authentication until the policy/identity work lands; trusted networks only):
#   docker run -p 7070:7070 execgate serve --listen 0.0.0.0:7070 --allow-remote ...
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY proto ./proto
COPY executor ./executor
COPY client ./client
COPY policies ./policies
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[daemon]"

FROM python:3.11-slim
RUN useradd --system --uid 10001 --create-home --home-dir /home/execgate execgate \
    && mkdir -p /var/lib/execgate /workspace \
    && chown execgate:execgate /var/lib/execgate /workspace \
    && chmod 0700 /var/lib/execgate
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "execgate[daemon]" && rm -rf /wheels
USER execgate
WORKDIR /home/execgate
VOLUME ["/var/lib/execgate", "/workspace"]
EXPOSE 7070
ENV EXECGATE_ADDR=unix:/var/lib/execgate/execgate.sock
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["execgate", "health"]
ENTRYPOINT ["execgate"]
CMD ["serve", "--state-dir", "/var/lib/execgate", "--workspace", "/workspace"]
