# Slipstream images, one Dockerfile, two targets:
#   docker build --target trainer -t slipstream-trainer:0.1.0 .   # torchrun -m trainers.train (the training pod)
#   docker build --target airflow -t slipstream-airflow:0.1.0 .   # Airflow 3 components + Spark (Java 17)
# Both run as the non-root user `slipstream` (uid 1000), matching SLIPSTREAM_RUN_AS_USER.

FROM python:3.11-slim-bookworm AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PYTHONPATH=/opt/slipstream:/opt/slipstream/plugins
RUN groupadd --gid 1000 slipstream && useradd --uid 1000 --gid 1000 --create-home slipstream
WORKDIR /opt/slipstream
COPY requirements.txt ./
# pip takes no extras in a constraints file: the pinned set without them
RUN sed -E 's/\[[^]]*\]//' requirements.txt > constraints.txt

# the loader's native kernels, compiled here so the trainer image needs no compiler
FROM base AS native
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
COPY slipstream/ slipstream/
RUN SLIPSTREAM_NATIVE_DIR=/opt/slipstream/native python -m slipstream.samples.native

FROM base AS trainer
# GPU nodes: the CUDA builds of torch and fbgemm with
#   --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 --build-arg FBGEMM=fbgemm-gpu
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG FBGEMM=fbgemm-gpu-cpu
COPY pyproject.toml README.md ./
COPY slipstream/ slipstream/
COPY trainers/ trainers/
# the core and the `trainer` extra, at the versions requirements.txt pins; torchrec depends on the
# CUDA fbgemm-gpu, which the FBGEMM build arg replaces on CPU images
RUN pip install --extra-index-url "${TORCH_INDEX}" -c constraints.txt ".[trainer]" \
 && if [ "${FBGEMM}" != fbgemm-gpu ]; then pip uninstall -y fbgemm-gpu \
      && pip install --no-deps --force-reinstall "${FBGEMM}==$(grep -E '^fbgemm-gpu-cpu==' requirements.txt | cut -d= -f3)"; fi
COPY --from=native /opt/slipstream/native/ /opt/slipstream/native/
ENV SLIPSTREAM_NATIVE_DIR=/opt/slipstream/native
USER 1000:1000
ENTRYPOINT []
CMD ["python", "-m", "slipstream.pipeline.podrun", "--help"]

FROM base AS airflow
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 AIRFLOW_HOME=/opt/airflow
COPY pyproject.toml README.md ./
COPY slipstream/ slipstream/
COPY spark_jobs/ spark_jobs/
COPY trainers/ trainers/
# Airflow runs the local trainer too (backend=local): every extra but dev, at the pinned versions
RUN pip install -c constraints.txt ".[airflow,spark,trainer]" psycopg2-binary==2.9.10 \
 && pip uninstall -y fbgemm-gpu && pip install --no-deps --force-reinstall $(grep -E '^fbgemm-gpu-cpu==' requirements.txt)
COPY --from=native /opt/slipstream/native/ /opt/slipstream/native/
ENV SLIPSTREAM_NATIVE_DIR=/opt/slipstream/native
COPY plugins/ plugins/
COPY dags/ dags/
RUN mkdir -p /opt/airflow /opt/slipstream/home && chown -R 1000:1000 /opt/airflow /opt/slipstream/home
USER 1000:1000
ENTRYPOINT ["airflow"]
