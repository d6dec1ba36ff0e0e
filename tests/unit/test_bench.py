"""`sparkfleet bench` and the rollout's bench gate without a lab: statistics, the SSE stream, records, the gate's
verdict, and real runs against the vLLM stand-in started on localhost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from sparkfleet import bench, rollout
from sparkfleet.config import SparkConfig
from sparkfleet.endpoint import Endpoint, resolve
from sparkfleet.recipes import Expected, load_recipes
from sparkfleet.remote import status as reporter
from tests.lab.standins.model import generate_checkpoint
from tests.lab.standins.vllm_data import write_image_data
from tests.unit.test_rollout import FakeRunner
from tests.unit.test_vllm_standin import KEY, RECIPE, SERVED, Standin, free_port, standin_argv, standin_env

REPO = Path(__file__).resolve().parents[2]
UNTUNED = [flag for flag in RECIPE if flag not in ("--moe-backend", "marlin")]
LOAD = bench.Load(concurrency=2, duration=1.5, prompt_tokens=32, max_tokens=24)
ARGV = ["vllm", "serve", "/models/nvidia--Qwen3.6-35B-A3B-NVFP4", "--host", "0.0.0.0", "--port", "8000",
        "--kv-cache-dtype", "fp8", "--attention-backend", "flashinfer", "--moe-backend", "marlin",
        "--max-num-seqs", "4", "--enable-prefix-caching", "--speculative-config",
        '{"method":"mtp","num_speculative_tokens":3}']
CONFIG = {"argv": ARGV, "image": "vllm/vllm-openai:v0.28.0", "image_digest": "vllm/vllm-openai@sha256:" + "a" * 64,
          "model_revision": "b" * 64, "driver": "580.95.05", "toolkit": "1.19.0-1", "hostname": "spark-01",
          "error": None}


@pytest.fixture(autouse=True)
def records_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every record a test writes lands under tmp_path, never in the real ~/.local/share."""
    monkeypatch.setenv("SPARKFLEET_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def record(config: dict[str, Any] = CONFIG, load: bench.Load = LOAD, known_good: bool = True,
           started_at: str = "2026-11-30T10:00:00+00:00", **figures: Any) -> dict[str, Any]:
    values = {"requests": 20, "errors": 0, "error": None, "ttft_p50": 0.05, "ttft_p95": 0.08,
              "tokens_per_second": 98.0, "aggregate_tokens_per_second": 190.0, "e2e_p50": 0.3, "e2e_p95": 0.35,
              "mtp_acceptance": 0.836, "seconds": 1.6} | figures
    return {"version": 1, "host": "spark-01", "url": "http://spark-01:8000", "served_name": SERVED,
            "recipe": "qwen3.6-35b-a3b-nvfp4", "started_at": started_at, "run": "bench", "known_good": known_good,
            "load": asdict(load), **values, "config": config, "versus_recipe": []}


# --- statistics ----------------------------------------------------------------------------------------


def test_percentiles_interpolate_between_samples() -> None:
    assert bench.percentile([], 0.5) is None
    assert bench.percentile([7.0], 0.95) == 7.0
    assert bench.percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert bench.percentile([float(n) for n in range(1, 101)], 0.95) == pytest.approx(95.05)
    assert bench.percentile([1.0, 2.0], 1.0) == 2.0


def test_figures_of_samples() -> None:
    samples = [bench.Sample(0.0, first=0.1, last=1.1, end=1.2, tokens=101),
               bench.Sample(0.0, first=0.3, last=0.8, end=0.9, tokens=51),
               bench.Sample(0.0, error="HTTP 503: loading")]
    result = bench.figures(samples, seconds=2.0, acceptance=0.8)
    assert (result.requests, result.errors, result.error) == (2, 1, "HTTP 503: loading")
    assert result.ttft_p50 == pytest.approx(0.2) and result.e2e_p95 == pytest.approx(1.185)
    assert result.tokens_per_second == pytest.approx(100.0)  # both streams decode at 100 tokens/s
    assert result.aggregate_tokens_per_second == pytest.approx(76.0)  # 152 tokens in 2 s
    assert result.mtp_acceptance == 0.8
    assert bench.Sample(0.0, first=0.1, last=0.1, tokens=1).decode_rate is None
    assert bench.figures([], seconds=None) == bench.Figures()


# --- the stream ----------------------------------------------------------------------------------------


def test_sse_events_follow_the_spec() -> None:
    raw = [b": keep-alive comment\n", b"data: {\"a\": 1}\r\n", b"\r\n", b"event: message\n", b"data: line one\n",
           b"data:line two\n", b"\n", b"\n", b"data: [DONE]\n"]
    assert list(bench.sse_events(raw)) == ['{"a": 1}', "line one\nline two", "[DONE]"]


@pytest.mark.parametrize(("delta", "expected"), [
    ({"role": "assistant", "content": ""}, False),
    ({"content": "Hello"}, True),
    ({"reasoning_content": "Let me think"}, True),
    ({"reasoning": "Let me think"}, True),
    ({"tool_calls": [{"index": 0, "function": {"name": "get_weather"}}]}, True),
    ({}, False),
])
def test_generated_output_counts_answer_reasoning_and_tool_calls(delta: dict, expected: bool) -> None:
    assert bench.generated({"choices": [{"index": 0, "delta": delta}]}) is expected
    assert bench.generated({"choices": [], "usage": {"completion_tokens": 3}}) is False


METRICS = """\
vllm:num_requests_running{engine="0",model_name="q"} 0.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="q"} %s
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="q"} %s
"""


def test_acceptance_is_the_delta_of_the_counters_over_the_run() -> None:
    before = reporter.parse_metrics(METRICS % (300.0, 246.0))
    after = reporter.parse_metrics(METRICS % (900.0, 746.0))
    assert bench.acceptance_delta(before, after) == pytest.approx(500 / 600, abs=1e-4)  # not 746 / 900
    assert bench.acceptance_delta(before, before) is None  # nothing drafted during the run
    plain = reporter.parse_metrics('vllm:num_requests_running{engine="0"} 0.0\n')
    assert bench.acceptance_delta(plain, plain) is None  # no MTP
    assert bench.acceptance_delta(None, after) is None  # /metrics unreadable


def test_prompt_and_request_body() -> None:
    body = bench.request_body("qwen", LOAD)
    assert (body["model"], body["max_tokens"], body["ignore_eos"], body["stream"]) == ("qwen", 24, True, True)
    assert body["stream_options"] == {"include_usage": True}
    text = bench.prompt_text(512, "n1")
    assert text.startswith("Request n1.") and 480 <= len(text.split()) <= 512
    assert bench.request_body("qwen", LOAD) != body  # a fresh nonce: prefix caching cannot skip the prefill


# --- records -------------------------------------------------------------------------------------------


def test_records_are_json_lines_per_host(records_home: Path) -> None:
    first, second = record(), record(mtp_acceptance=0.5, known_good=False)
    path = bench.append(first)
    bench.append(second)
    assert path == records_home / "bench" / "spark-01.jsonl"
    with path.open("a") as out:
        out.write('{"cut short": \n')
    assert bench.read("spark-01") == [first, second]
    assert bench.read("spark-02") == []


def test_records_default_to_the_users_data_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARKFLEET_HOME")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    assert bench.records_path("spark-01") == Path.home() / ".local/share/sparkfleet/bench/spark-01.jsonl"


def test_reference_is_the_last_known_good_record_of_this_config_and_load() -> None:
    old = record(started_at="2026-11-01T00:00:00+00:00")
    newer = record(started_at="2026-11-02T00:00:00+00:00")
    failed = record(known_good=False, started_at="2026-11-03T00:00:00+00:00")
    other_load = record(load=bench.Load(), started_at="2026-11-04T00:00:00+00:00")
    other_image = record(config=CONFIG | {"image_digest": "sha256:" + "c" * 64})
    records = [old, newer, failed, other_load, other_image]
    assert bench.reference(records, CONFIG, LOAD) == newer
    assert bench.reference(records, CONFIG | {"driver": "590.1"}, LOAD) is None
    assert bench.reference(records, CONFIG | {"error": "unreachable"}, LOAD) is None


def test_serving_config_from_the_reporter() -> None:
    report = {"host": "spark-01", "toolkit_version": "1.19.0-1", "served_name": "q",
              "serving": {"argv": ARGV, "image": "vllm/vllm-openai:v0.28.0", "image_digest": CONFIG["image_digest"],
                          "weights_digest": "b" * 64, "driver": "580.95.05"}}
    assert bench.serving_config(report, None, "org/m@main") == CONFIG
    without_weights = bench.serving_config(report | {"serving": report["serving"] | {"weights_digest": None}}, None,
                                           "org/m@main")
    assert without_weights["model_revision"] == "org/m@main"
    unread = bench.serving_config(None, "unreachable: cannot connect over SSH", "org/m@main")
    assert unread["argv"] is None and unread["error"] == "unreachable: cannot connect over SSH"
    assert "deploy this host" in bench.serving_config({"state": "active"}, None, "org/m@main")["error"]


def test_recipe_expectations_are_floors_with_their_source() -> None:
    expected = load_recipes()["qwen3.6-35b-a3b-nvfp4"].expected
    assert expected is not None and expected.mtp_acceptance == 0.78
    assert "seed 004" in expected.source and "2 speculative tokens" in expected.source
    assert "vLLM 0.24" in expected.source
    result = bench.Figures(tokens_per_second=60.0, mtp_acceptance=0.55)
    rows = bench.versus_recipe(result, expected, bench.Load(concurrency=1))
    assert [(r["figure"], r["meets"]) for r in rows] == [("mtp_acceptance", False), ("tokens_per_second", True)]
    assert [r["figure"] for r in bench.versus_recipe(result, expected, bench.Load(concurrency=4))] == [
        "mtp_acceptance"]  # tokens/s was measured with one stream
    assert bench.versus_recipe(result, None, LOAD) == []
    assert bench.versus_recipe(bench.Figures(), Expected(mtp_acceptance=0.7, source="s"), LOAD)[0]["meets"] is False


# --- the config read over SSH --------------------------------------------------------------------------


def test_reporter_reads_the_serving_config() -> None:
    container = json.dumps({"path": "vllm", "args": ARGV[1:], "image": "vllm/vllm-openai:v0.28.0",
                            "image_id": "sha256:" + "f" * 64})
    digests = json.dumps(["lab.registry:5000/vllm/vllm-openai@sha256:" + "e" * 64,
                          "vllm/vllm-openai@sha256:" + "a" * 64])
    serving = reporter.parse_serving(container, digests, {"source_digest": "b" * 64, "files": {}}, "580.95.05\n")
    assert serving == {"argv": ARGV, "image": "vllm/vllm-openai:v0.28.0", "image_digest": CONFIG["image_digest"],
                       "weights_digest": "b" * 64, "driver": "580.95.05"}
    assert reporter.parse_serving(container, "[]", None, None)["image_digest"] == "sha256:" + "f" * 64
    assert reporter.parse_serving(None, None, None, None) == {"argv": None, "image": None, "image_digest": None,
                                                              "weights_digest": None, "driver": None}
    assert reporter.repository("lab:5000/vllm/vllm-openai:v1@sha256:00") == "lab:5000/vllm/vllm-openai"
    assert reporter.repository("registry.lab:5000/vllm") == "registry.lab:5000/vllm"


def test_reporter_serving_flag_on_a_bare_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(reporter, "run", lambda argv, timeout: None)
    files = {name: str(tmp_path / name) for name in ("unit-file", "env-file", "daemon-json", "health-config",
                                                      "loaded-weights")}
    layout = ["--unit", "u.service", "--container", "c", *(f"--{name}={path}" for name, path in files.items())]
    assert reporter.main([*layout, "--serving"]) == 0
    report = json.loads(capsys.readouterr().out[len(reporter.MARKER):])
    assert report["serving"] == {"argv": None, "image": None, "image_digest": None, "weights_digest": None,
                                 "driver": None}


# --- the gate's verdict --------------------------------------------------------------------------------


def without(argv: list[str], flag: str) -> list[str]:
    at = argv.index(flag)
    return argv[:at] + argv[at + 2:]


def test_argv_flags_and_config_changes() -> None:
    flags = bench.argv_flags(["vllm", "serve", "/m", "--a", "1", "--b", "--c=x y", "--d", "p", "q"])
    assert flags == {"": "vllm serve /m", "--a": "1", "--b": "", "--c": "x y", "--d": "p q"}
    changed = [*without(ARGV, "--moe-backend"), "--async-scheduling"]
    changed[changed.index("--max-num-seqs") + 1] = "3"
    after = CONFIG | {"argv": changed, "image_digest": "vllm/vllm-openai@sha256:" + "d" * 64}
    assert bench.config_changes(CONFIG, after) == [
        "removed --moe-backend marlin", "added --async-scheduling", "--max-num-seqs 4 → 3",
        "image vllm/vllm-openai@sha256:aaaaaaaaaaaa… → vllm/vllm-openai@sha256:dddddddddddd…"]
    assert bench.config_changes(CONFIG, CONFIG | {"model_revision": "c" * 64, "toolkit": "1.19.1-1"}) == [
        "weights bbbbbbbbbbbb… → cccccccccccc…", "toolkit 1.19.0-1 → 1.19.1-1"]
    assert bench.config_changes(CONFIG, CONFIG) == []


def test_a_dropped_mtp_acceptance_fails_naming_the_figure_and_the_removed_flag() -> None:
    before = record()
    after = record(config=CONFIG | {"argv": without(ARGV, "--moe-backend")}, mtp_acceptance=0.552,
                   tokens_per_second=81.0, aggregate_tokens_per_second=175.0)
    verdict = bench.compare(before, after, 0.15)
    assert not verdict.passed
    assert verdict.drops == ["MTP acceptance 83.6% → 55.2% (-34%)", "tokens/s per stream 98.0 → 81.0 (-17%)"]
    assert verdict.message() == (
        "bench dropped: MTP acceptance 83.6% → 55.2% (-34%); tokens/s per stream 98.0 → 81.0 (-17%); config since "
        "the known-good record of 2026-11-30T10:00:00+00:00: removed --moe-backend marlin")
    assert verdict.as_dict()["figures"]["mtp_acceptance"] == {"before": 0.836, "after": 0.552}


def test_a_change_within_the_tolerance_passes() -> None:
    after = record(tokens_per_second=90.0, mtp_acceptance=0.80)  # -8 % and -4 %
    verdict = bench.compare(record(), after, 0.15)
    assert verdict.passed and verdict.drops == []
    assert verdict.message().startswith("bench: MTP acceptance 83.6% → 80.0%, tokens/s per stream 98.0 → 90.0")
    assert not bench.compare(record(), after, 0.05).passed


def test_gate_edge_cases() -> None:
    no_mtp = bench.compare(record(), record(mtp_acceptance=None), 0.15)
    assert no_mtp.drops == ["MTP acceptance 83.6% → none"]
    assert bench.compare(record(mtp_acceptance=None), record(), 0.15).passed  # MTP turned on: nothing to lose
    failing = bench.compare(record(), record(errors=3, error="HTTP 500: boom"), 0.15)
    assert failing.drops == ["failed requests 0 → 3 (HTTP 500: boom)"]
    alone = bench.compare(None, record(), 0.15)
    assert alone.passed and alone.message().endswith("(no known-good record to compare with)")
    dead = bench.compare(None, record(requests=0, errors=1, error="warm-up request failed: HTTP 401: Unauthorized",
                                      tokens_per_second=None, aggregate_tokens_per_second=None), 0.15)
    assert dead.message() == "bench dropped: failed requests 0 → 1 (warm-up request failed: HTTP 401: Unauthorized)"


@pytest.mark.parametrize(("text", "ok"), [("0.15", True), ("0", True), ("1", False), ("-0.1", False),
                                          ("15%", False)])
def test_rollout_tolerance_is_a_fraction(text: str, ok: bool) -> None:
    if ok:
        assert rollout.tolerance(text) == float(text)
    else:
        with pytest.raises(rollout.argparse.ArgumentTypeError, match="fraction"):
            rollout.tolerance(text)


# --- rendering -----------------------------------------------------------------------------------------


def test_tables_fit_80_columns() -> None:
    target = bench.Target("spark-arm64-01", "http://x:8000", SERVED, None, "qwen3.6-35b-a3b-nvfp4")
    probe = bench.Probe(target, LOAD)
    console = Console(width=80, record=True)
    console.print(bench.live_table([probe], LOAD, console))
    console.print(bench.summary_table([record(errors=2, error="HTTP 503")], console))
    lines = console.export_text().splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    assert any("spark-arm64-01" in line and "warm-up" in line for line in lines)
    assert any("spark-01" in line and "0.05/0.08" in line and "83.6%" in line for line in lines)


def test_notes_say_how_the_host_compares_with_its_recipe() -> None:
    expected = load_recipes()["qwen3.6-35b-a3b-nvfp4"].expected
    rows = bench.versus_recipe(bench.Figures(mtp_acceptance=0.552), expected, LOAD)
    lines = bench.notes(record() | {"versus_recipe": rows})
    assert lines[0].startswith("spark-01: vllm/vllm-openai@sha256:aaaaaaaaaaaa…, weights bbbbbbbbbbbb…, driver "
                               "580.95.05, toolkit 1.19.0-1")
    assert lines[1] == "spark-01: MTP acceptance 55.2% [bold red]is below[/] qwen3.6-35b-a3b-nvfp4's 78.0%"
    (source,) = bench.sources([record() | {"versus_recipe": rows}] * 2)
    assert source.startswith("qwen3.6-35b-a3b-nvfp4's figures: seed 004 (spark-56bc, 2026-07-11): 78-89 %")


# --- against the stand-in ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Standin]]:
    """Start vLLM stand-ins (the recipe's flags by default) on free ports; all are killed at the end."""
    data = tmp_path_factory.mktemp("standin-data")
    write_image_data(data)
    model = tmp_path_factory.mktemp("models") / "Qwen3.6-35B-A3B"
    generate_checkpoint(model, total_bytes=64 << 10, shards=2)
    started: list[Standin] = []

    def start(flags: list[str] = RECIPE) -> Standin:
        port = free_port()
        log = tmp_path_factory.mktemp("standin-log") / "out.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(standin_argv(model, tuple(flags), port), stdout=out, stderr=subprocess.STDOUT,
                                    env=standin_env(data, 0.2, VLLM_API_KEY=KEY, VLLM_STANDIN_TOKEN_SECONDS="0.01"))
        started.append(Standin(proc, port, log))
        started[-1].wait_ready()
        return started[-1]

    yield start
    for standin in started:
        standin.proc.kill()
        standin.proc.wait()


def endpoint(port: int, host: str = "spark-01") -> Endpoint:
    config = SparkConfig(vllm_url=f"http://127.0.0.1:{port}", vllm_served_model_name=SERVED,
                         vllm_api_key="env:SPARKFLEET_TEST_KEY", model_source="http://mirror.lan/m")
    return resolve(host, config)


def test_a_bench_measures_the_stand_in(serve: Callable[..., Standin], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKFLEET_TEST_KEY", KEY)
    tuned, untuned = serve(), serve(UNTUNED)
    probes = [bench.Probe(bench.target(endpoint(s.port), None), LOAD) for s in (tuned, untuned)]
    bench.measure(probes)
    good, bad = (probe.figures() for probe in probes)
    for result in (good, bad):
        assert result.requests >= 4 and result.errors == 0, result
        assert 0 < result.ttft_p50 <= result.ttft_p95 < result.e2e_p50 <= result.e2e_p95
        assert result.aggregate_tokens_per_second > result.tokens_per_second > 0  # two streams
    assert 0.76 <= good.mtp_acceptance <= 0.91  # seed 004: 78-89 % with the three kernel flags
    assert 0.44 <= bad.mtp_acceptance <= 0.67  # 46-65 % without them
    assert 70 <= good.tokens_per_second <= 105  # 10 ms per token
    assert bad.tokens_per_second < good.tokens_per_second  # two streams: slower without the kernel flags


def test_a_wrong_key_is_one_failure_not_a_storm(serve: Callable[..., Standin]) -> None:
    target = bench.Target("spark-01", f"http://127.0.0.1:{serve().port}", SERVED, "wrong", "r")
    probe = bench.Probe(target, LOAD)
    probe.run()
    result = probe.figures()
    assert (result.requests, result.errors) == (0, 1)
    assert result.error == "warm-up request failed: HTTP 401: Unauthorized"


def test_the_gate_catches_a_removed_kernel_flag_and_passes_a_harmless_change(
        serve: Callable[..., Standin], monkeypatch: pytest.MonkeyPatch, records_home: Path) -> None:
    """A rollout's gate end to end, its SSH reads replaced by the configs each stand-in runs with."""
    monkeypatch.setenv("SPARKFLEET_TEST_KEY", KEY)
    running: dict[str, dict[str, Any]] = {"spark-01": CONFIG}
    monkeypatch.setattr(bench, "read_configs", lambda state, hosts, endpoints: {
        name: (running[name], SERVED) for name in endpoints if name in running})
    said: list[str] = []
    before = serve()
    gate = bench.Gate(None, {"spark-01": SimpleNamespace(data={})}, {"spark-01": endpoint(before.port)}, LOAD, 0.15,
                      said.append)
    gate.prepare(["spark-01"])  # no known-good record yet: a baseline of what runs now
    assert said == ["bench (baseline) of spark-01: 2 streams for 1.5 s"]
    (baseline,) = bench.read("spark-01")
    assert baseline["run"] == "baseline" and baseline["known_good"] is True

    # The batch removes --moe-backend: the host now runs the stand-in without it.
    gate.endpoints["spark-01"] = endpoint(serve(UNTUNED).port)
    running["spark-01"] = CONFIG | {"argv": without(ARGV, "--moe-backend")}
    failures = gate.check(["spark-01"])
    gate.commit(["spark-01"], passed=not failures)
    assert failures["spark-01"].startswith("bench dropped: MTP acceptance ")
    assert failures["spark-01"].endswith(f"config since the known-good record of {baseline['started_at']}: "
                                         "removed --moe-backend marlin")
    assert bench.read("spark-01")[-1]["known_good"] is False

    # Rolled back, then a harmless change: compared with the same baseline (no second one), it passes.
    said.clear()
    gate = bench.Gate(None, {"spark-01": SimpleNamespace(data={})}, {"spark-01": endpoint(before.port)}, LOAD, 0.15,
                      said.append)
    running["spark-01"] = CONFIG
    gate.prepare(["spark-01"])
    assert said == [] and gate.references["spark-01"] == baseline
    gate.endpoints["spark-01"] = endpoint(serve([*RECIPE, "--max-num-seqs", "3"]).port)
    running["spark-01"] = CONFIG | {"argv": [*ARGV[:-2], "--max-num-seqs", "3", *ARGV[-2:]]}
    assert gate.check(["spark-01"]) == {}
    gate.commit(["spark-01"], passed=True)
    assert gate.verdicts["spark-01"].message().startswith("bench: MTP acceptance ")
    last = bench.read("spark-01")[-1]
    assert (last["run"], last["known_good"]) == ("gate", True)


def test_a_failed_bench_gate_rolls_the_batch_back() -> None:
    """The rollout's wiring: reference before the change, bench after the health gate, restore on a drop."""
    calls: list[str] = []

    class FakeGate:
        hosts = {"s1": None, "s2": None}
        verdicts = {"s1": bench.Verdict(False, ["MTP acceptance 83.6% → 55.2% (-34%)"], reference="t")}

        def prepare(self, members: list[str]) -> None:
            calls.append(f"prepare {members}")

        def check(self, members: list[str]) -> dict[str, str]:
            calls.append(f"check {members}")
            return {"s1": self.verdicts["s1"].message()}

        def commit(self, members: list[str], passed: bool) -> None:
            calls.append(f"commit {members} {passed}")

    plan = rollout.run(FakeRunner(calls=calls), ["s1", "s2"], {"s1", "s2"}, 1, 1, 60,  # type: ignore[arg-type]
                       lambda line: None, FakeGate())  # type: ignore[arg-type]
    assert calls == ["stage s1 s2", "prepare ['s1']", "snapshot s1", "deploy s1", "gate s1", "check ['s1']",
                     "commit ['s1'] False", "restore s1", "gate s1"]
    assert plan.failed_batch == 0
    assert (plan.results["s1"].outcome, plan.results["s2"].outcome) == ("rolled-back", "skipped")
    assert plan.results["s1"].diagnosis == "bench dropped: MTP acceptance 83.6% → 55.2% (-34%); config since the " \
                                           "known-good record of t: no difference (the host itself changed?)"


def test_the_command_prints_records_and_keeps_them(serve: Callable[..., Standin], tmp_path: Path) -> None:
    """`sparkfleet bench INVENTORY --json` in its own process (pyinfra_cli patches the interpreter with gevent);
    the host's SSH port is closed, so its figures come with the reason its config is missing."""
    standin = serve()
    inventory = tmp_path / "fleet.py"
    inventory.write_text(f"""sparks = [("spark-01", {{
    "ssh_hostname": "127.0.0.1", "ssh_port": {free_port()}, "model_source": "http://mirror.lan/m",
    "vllm_url": "http://127.0.0.1:{standin.port}", "vllm_api_key": "env:SPARKFLEET_TEST_KEY",
    "vllm_served_model_name": "{SERVED}"}})]
""")
    env = {**os.environ, "PYTHONPATH": str(REPO), "SPARKFLEET_TEST_KEY": KEY, "SPARKFLEET_HOME": str(tmp_path / "h")}
    result = subprocess.run([sys.executable, "-m", "sparkfleet", "bench", inventory.name, "--json", "--concurrency",
                             "2", "--duration", "1", "--prompt-tokens", "32", "--max-tokens", "16"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    (answer,) = json.loads(result.stdout)
    for name in ("ttft_p50", "ttft_p95", "tokens_per_second", "aggregate_tokens_per_second", "e2e_p50", "e2e_p95",
                 "mtp_acceptance"):
        assert answer[name] > 0, name
    assert (answer["host"], answer["errors"], answer["recipe"]) == ("spark-01", 0, "qwen3.6-35b-a3b-nvfp4")
    assert answer["load"] == {"concurrency": 2, "duration": 1.0, "prompt_tokens": 32, "max_tokens": 16}
    assert answer["config"]["argv"] is None
    assert answer["config"]["error"].startswith("unreachable: cannot connect over SSH")
    assert answer["versus_recipe"][0]["figure"] == "mtp_acceptance" and answer["versus_recipe"][0]["meets"]
    kept = (tmp_path / "h" / "bench" / "spark-01.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in kept] == [answer]
