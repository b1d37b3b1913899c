# The execgate daemon.
#
# Build (online):   docker build -t execgate .
# Build (offline, no registry): make a base image with Python 3.11+ (and bubblewrap),
# prebuild the wheels on the host, and point the build at both:
#   sudo docker/make-base-image.sh execgate-base:bookworm       # debootstrap + docker import
#   pip wheel '.[daemon]' --wheel-dir wheels
#   docker build --build-arg BASE=execgate-base:bookworm --build-arg WHEELS=wheels -t execgate .
#
# Run (Unix socket in a volume: the default and the safe choice). Commands run in the
# bubblewrap sandbox inside the container, which needs user namespaces and a fresh /proc
# there, so docker's own seccomp, AppArmor and /proc masking must step aside:
#   docker run --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
#       --security-opt systempaths=unconfined \
#       -v execgate-state:/var/lib/execgate -v "$PWD/workspace:/workspace" execgate
# That trades the container's outer filters for a sandbox per command (own PID, network,
# IPC and UTS namespaces, no capabilities, uid 10001). Without those options
# `--sandbox auto` falls back to the process backend (no isolation beyond the container)
# and the startup log says so. The workspace must be writable by uid 10001.
#
# Identities: on the Unix socket without an identities file every caller is `local` with
# every role; the socket is owner-only (uid 10001 here), so only that user (or root) can
# connect. Any TCP listener needs an identities file (execgate token new NAME --role agent),
# and off loopback also TLS (--tls-cert/--tls-key/--tls-client-ca) or --allow-remote:
#   docker run -p 7070:7070 -v "$PWD/ids.yaml:/etc/execgate/ids.yaml:ro" execgate \
#       serve --listen 0.0.0.0:7070 --identities /etc/execgate/ids.yaml --tls-cert ... 
ARG BASE=python:3.11-slim

FROM ${BASE} AS wheels
# A directory of prebuilt wheels in the build context (execgate's and its dependencies'),
# for a build without a package index; empty: build them here from PyPI.
ARG WHEELS=
WORKDIR /src
COPY . .
RUN if [ -n "$WHEELS" ]; then cp -r "$WHEELS" /wheels; \
    else python3 -m pip wheel --no-cache-dir --wheel-dir /wheels ".[daemon]"; fi

FROM ${BASE}
# bubblewrap: the sandbox commands run in. An offline base image brings it already.
RUN command -v bwrap >/dev/null || (apt-get update \
        && apt-get install -y --no-install-recommends bubblewrap \
        && rm -rf /var/lib/apt/lists/*)
RUN useradd --system --uid 10001 --create-home --home-dir /home/execgate execgate \
    && mkdir -p /var/lib/execgate /workspace \
    && chown execgate:execgate /var/lib/execgate /workspace \
    && chmod 0700 /var/lib/execgate
COPY --from=wheels /wheels /wheels
RUN python3 -m venv /opt/execgate \
    && /opt/execgate/bin/pip install --no-cache-dir --no-index --find-links /wheels \
        "execgate[daemon]" \
    && rm -rf /wheels
ENV PATH=/opt/execgate/bin:$PATH
USER execgate
WORKDIR /home/execgate
VOLUME ["/var/lib/execgate", "/workspace"]
EXPOSE 7070
ENV EXECGATE_ADDR=unix:/var/lib/execgate/execgate.sock
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["execgate", "health"]
ENTRYPOINT ["execgate"]
CMD ["serve", "--state-dir", "/var/lib/execgate", "--workspace", "/workspace"]
