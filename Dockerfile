# MemoryMark as a container: a Hugging Face Space (Docker SDK) or any container host.
#
#   docker build -t memorymark . && docker run -p 8501:8501 memorymark
#
# The hosted defaults are on (MEMORYMARK_HOSTED=true: per-visitor history, no user code, no
# cpu backend, one sweep worker) and torch is the CPU build (hosted/requirements.txt). Python
# 3.11 is what the test suite runs on.
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MEMORYMARK_HOSTED=true \
    PORT=8501

# Hugging Face runs a Space's container as user 1000 (huggingface.co/docs/hub/spaces-sdks-docker,
# "Permissions"); any other host runs it the same way. HOME holds the history file's folder.
RUN useradd --create-home --uid 1000 user
WORKDIR /app

# The requirements first, in a layer of their own: a code change does not reinstall torch.
COPY requirements.txt ./requirements.txt
COPY hosted/requirements.txt ./hosted/requirements.txt
RUN pip install -r hosted/requirements.txt

COPY --chown=user . .
RUN pip install --no-deps . && chown user /app
USER user
ENV HOME=/home/user

EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s \
    CMD python -c "import os, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ[\"PORT\"]}/_stcore/health', timeout=4)"
# A host that sets PORT (Cloud Run, Render, Fly) gets the app on it; 8501 otherwise.
CMD ["sh", "-c", "exec streamlit run app.py --server.port=${PORT} --server.address=0.0.0.0"]
