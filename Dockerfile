# nexus-admit controller image: the wheel and its runtime dependencies, nothing else.
#
#   make image                     # buildah; tags nexus-admit:<version> (docs/admin-guide.md)
#   docker build -t <your-registry>/nexus-admit:<version> .
#
# Stage 1 builds wheels for nexus-admit[controller] and every dependency (not the extra
# `report`: matplotlib draws the simulator's plots only, and is large); stage 2 installs
# them from that directory only (no index, no compiler, no sources) and runs as a non-root
# numeric user, so the chart's runAsNonRoot / readOnlyRootFilesystem settings hold.
#
# PYTHON_IMAGE: any image with Python 3.11+ whose `pip` installs into a writable
# environment on PATH (the official slim image; `make image IMAGE_BASE=local` builds one
# from Debian packages). Stage 1 may be given the build machine's pip settings as the
# secret `pip.conf` (and the CA bundle it names as `pip-cert`, which it must then name as
# /run/secrets/pip-cert); its pip cache is a cache mount. Neither ends up in the image.
# tests/test_image.py checks the recipe; e2e/tests/test_image.py builds and runs it.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY nexus_admit ./nexus_admit
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    --mount=type=secret,id=pip-cert,target=/run/secrets/pip-cert \
    --mount=type=cache,target=/root/.cache/pip \
    pip wheel --wheel-dir /wheels ".[controller]"

FROM ${PYTHON_IMAGE}
# glibc gives each thread that allocates an arena of its own (8 per core) and an arena keeps
# what it once held: the controller's RSS climbed 31 % over a 20-minute soak without a cap;
# two arenas are plenty under the GIL
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MALLOC_ARENA_MAX=2 \
    HOME=/tmp
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels "nexus-admit[controller]"
# a name for the user (ps, logs); `nexus-admit run` no longer needs one (it names kopf's
# operator after its leader identity), so a platform's arbitrary uid runs it too
RUN echo "nexus-admit:x:65532:65532:nexus-admit:/tmp:/usr/sbin/nologin" >> /etc/passwd \
 && echo "nexus-admit:x:65532:" >> /etc/group
USER 65532:65532
EXPOSE 8080 9443
ENTRYPOINT ["nexus-admit"]
CMD ["run"]
