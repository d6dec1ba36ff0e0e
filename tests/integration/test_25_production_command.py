"""The production `docker run` line of DOMAIN.md, unchanged, against the stand-ins on an amd64 lab host."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.integration.conftest import converge, on_host, served_weights
from tests.lab import fleet

HOST = "spark-01"

PRODUCTION = (
    "docker run {detach} --name prodcheck --runtime=nvidia --gpus all --ipc=host --network host "
    "--ulimit memlock=-1 --ulimit stack=67108864 -e VLLM_STANDIN_LOAD_SECONDS=1 "
    "-v {weights}:/root/model:ro vllm/vllm-openai:v0.28.0 /root/model --host 0.0.0.0 --port 8100 "
    "--tensor-parallel-size 1 --trust-remote-code --kv-cache-dtype fp8 --attention-backend flashinfer "
    "--moe-backend marlin --gpu-memory-utilization 0.7 --max-model-len 262144 --max-num-seqs 4 "
    "--max-num-batched-tokens 8192 --enable-chunked-prefill --async-scheduling --enable-prefix-caching "
    "--speculative-config '{{\"method\":\"mtp\",\"num_speculative_tokens\":3,\"moe_backend\":\"triton\"}}' "
    "--load-format fastsafetensors --reasoning-parser qwen3 --enable-auto-tool-choice {extra}"
)


@pytest.fixture(scope="module")
def spark01_converged(lab: fleet.LabState) -> fleet.LabHost:
    """spark-01 deployed: the weights staged and the image pulled that the production command uses."""
    converge(HOST)
    return lab.host(HOST)


@pytest.fixture
def spark01(spark01_converged: fleet.LabHost) -> Iterator[fleet.LabHost]:
    yield spark01_converged
    on_host(spark01_converged.container, "docker rm -f prodcheck >/dev/null 2>&1; true")


def test_production_command_serves_models(spark01: fleet.LabHost) -> None:
    on_host(spark01.container, PRODUCTION.format(detach="-d", extra="--tool-call-parser qwen3_xml",
                                                   weights=served_weights(spark01.container)))
    models = on_host(spark01.container, "for i in $(seq 60); do curl -sf http://127.0.0.1:8100/v1/models && break; "
                                        "sleep 1; done")
    assert json.loads(models)["data"][0]["id"] == "/root/model"


@pytest.mark.parametrize(("extra", "message"), [
    ("--tool-call-parser qwen", "invalid tool call parser: qwen"),
    ("--tool-call-parser qwen3_xml --disable-log-requests", "unrecognized arguments: --disable-log-requests"),
])
def test_production_command_rejects_what_vllm_rejects(spark01: fleet.LabHost, extra: str, message: str) -> None:
    command = PRODUCTION.format(detach="--rm", extra=extra, weights=served_weights(spark01.container))
    out = on_host(spark01.container, f"{command} 2>&1; echo exit=$?", check=False)
    assert message in out
    assert "exit=0" not in out
