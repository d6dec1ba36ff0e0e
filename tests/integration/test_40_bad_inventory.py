"""Bad inventory values stop the run before any host is touched, with one clear message and no traceback."""

from __future__ import annotations

import pytest

from tests.integration.conftest import Run, pyinfra

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
}


@pytest.mark.parametrize("case", CASES)
def test_bad_value_fails_before_any_change(deployed: Run, case: str) -> None:
    data, field, fix = CASES[case]
    args = [arg for item in data for arg in ("--data", item)]
    run = pyinfra(*args, "deploy.py", check=False)
    assert run.returncode != 0
    assert "spark-01: `" + field in run.output, run.output[-2000:]
    assert fix in run.output
    assert "nothing was changed on any host" in run.output
    assert "Traceback" not in run.output
    assert "Starting operation" not in run.output
