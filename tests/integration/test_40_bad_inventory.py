"""Bad inventory values stop the run before any host is touched, with one clear message and no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.conftest import INVENTORY, on_host, pyinfra
from tests.lab import REPO, fleet

INVOCATION = "systemctl show -p InvocationID --value sparkfleet-vllm.service docker.service"

CASES = {
    "parser-qwen": (['vllm_args={"tool-call-parser": "qwen"}'], "vllm_args.tool-call-parser", "qwen3_xml"),
    "removed-flag": (['vllm_args={"disable-log-requests": true}'], "vllm_args.disable-log-requests",
                     "request logging is off by default"),
    "quantization-a3b_fp8": (['vllm_args={"quantization": "a3b_fp8"}'], "vllm_args.quantization", "fp8"),
    "tensor-parallel-2": (['vllm_args={"tensor-parallel-size": 2}'], "vllm_args.tensor-parallel-size",
                          "set tensor-parallel-size to 1"),
    "gpu-memory-1.2": (['vllm_args={"gpu-memory-utilization": 1.2}'], "vllm_args.gpu-memory-utilization",
                       "outside (0, 1]"),
    "length-not-a-number": (['vllm_args={"max-model-len": "lots"}'], "vllm_args.max-model-len", "not a number"),
    "unknown-recipe": (["vllm_recipe=qwen3.6-35b-a3b-nvfp5"], "vllm_recipe", "qwen3.6-35b-a3b-nvfp4"),
    "relative-model-dir": (["model_dir=models/qwen"], "model_dir", "absolute path"),
    "misspelled-variable": (["vllm_recipie=qwen3.6-35b-a3b-fp8"], "vllm_recipie", "Did you mean `vllm_recipe`?"),
    "literal-secret": (["vllm_api_key=sk-literal"], "vllm_api_key", "env:VARIABLE"),
    # Round two (issue 10): each reached a host, or a traceback, before.
    "max-num-seqs-negative": (['vllm_args={"max-num-seqs": -1}'], "vllm_args.max-num-seqs", "give e.g. 4"),
    "binary-size-with-decimal": (['vllm_args={"max-num-batched-tokens": "1.5K"}'],
                                 "vllm_args.max-num-batched-tokens", "write 1.5k or 1536"),
    "missing-controller-dir": (["model_source=/nonexistent/models"], "model_source",
                               "does not exist on this controller"),
    "url-with-a-quote": (["nvidia_key_url=http://nvidia.lab/gpg'key"], "nvidia_key_url", "percent-encode it"),
    "known-bad-image": (["vllm_recipe=qwen3.6-35b-a3b-fp8", "vllm_image=vllm/vllm-openai:cu130-nightly"],
                        "vllm_image", "vllm #42738"),
}


# The inventory is validated before any host is read, so these need the lab up, deployed to or not.
@pytest.mark.parametrize("case", CASES)
def test_bad_value_fails_before_any_change(lab: fleet.LabState, case: str) -> None:
    data, field, fix = CASES[case]
    args = [arg for item in data for arg in ("--data", item)]
    run = pyinfra(*args, "deploy.py", check=False)
    assert run.returncode != 0
    assert "spark-01: `" + field in run.output, run.output[-2000:]
    assert fix in run.output
    assert "nothing was changed on any host" in run.output
    assert "Traceback" not in run.output
    assert "Starting operation" not in run.output


@pytest.mark.parametrize(("args", "message"), [
    (["rollout", "--canary", "0"], "argument --canary: 0 hosts cannot make a batch: give 1 or more"),
    (["doctor", "--limit", "spark-9*"], "--limit spark-9* matches no host in inventory/lab.py"),
    (["rollout", "--limit", "nowhere"], "--limit nowhere matches no host in inventory/lab.py"),
])
def test_bad_arguments_are_one_message(lab: fleet.LabState, args: list[str], message: str) -> None:
    before = {h.name: on_host(h.container, INVOCATION) for h in lab.hosts}
    result = subprocess.run([sys.executable, "-m", "sparkfleet", args[0], INVENTORY, *args[1:]], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr + result.stdout
    assert {h.name: on_host(h.container, INVOCATION) for h in lab.hosts} == before
