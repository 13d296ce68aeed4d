# nexus-admit controller image: the wheel and its runtime dependencies, nothing else.
#
#   docker build -t <your-registry>/nexus-admit:0.1.0 .
#
# Stage 1 builds wheels for nexus-admit[controller] and every dependency (not the extra
# `report`: matplotlib draws the simulator's plots only, and is large); stage 2 installs
# them from that directory only (no index, no compiler, no sources) and runs as a non-root
# numeric user, so the chart's runAsNonRoot / readOnlyRootFilesystem settings hold.
# tests/test_image.py checks what can be checked without a container engine.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY nexus_admit ./nexus_admit
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[controller]"

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels "nexus-admit[controller]"
USER 65532:65532
EXPOSE 8080 9443
ENTRYPOINT ["nexus-admit"]
CMD ["run"]
