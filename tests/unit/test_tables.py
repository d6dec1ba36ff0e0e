"""Tables fit the terminal they are read in, `--wide` keeps every column, and off a terminal they are plain text."""

from __future__ import annotations

import io
import re

import pytest
from rich.cells import cell_len
from rich.console import Console

from sparkfleet import bench, doctor, rollout, status
from tests.unit.test_bench import record
from tests.unit.test_preflight import endpoint, facts

ANSI = re.compile(r"\x1b\[[0-9;]*m")
BOX_DRAWING = re.compile("[\u2500-\u259f]")
MODEL = "nvidia/Qwen3.6-35B-A3B-NVFP4"
ALERT = "2026-11-29T17:00:00+00:00 crashloop/cutlass"


def _serving(**changes: object) -> dict[str, object]:
    return {"state": "active", "sub_state": "running", "uptime_seconds": 11520, "restarts": 0, "model": MODEL,
            "image": "vllm/vllm-openai:v0.28.0", "served_name": MODEL, "requests_running": 2,
            "requests_waiting": 0, "kv_cache_usage": 0.125, "mtp_acceptance": 0.8234,
            "last_result": {"state": "healthy"}, "last_alert": None} | changes


# A lab-sized fleet: serving, crash-looping, loading, staged only (emulated arm64), unreachable.
ANSWERS = [
    status.Answer("spark-01", _serving()),
    status.Answer("spark-02", _serving(restarts=3, uptime_seconds=303, last_result={"state": "unhealthy"},
                                       last_alert={"time": "2026-11-29T17:00:00+00:00", "cause": "crashloop/cutlass"})),
    status.Answer("spark-03", _serving(state="activating", sub_state="start", uptime_seconds=42,
                                       requests_running=None, requests_waiting=None, kv_cache_usage=None,
                                       mtp_acceptance=None, last_result={"state": "starting"})),
    status.Answer("spark-arm64-01", {"state": "inactive", "sub_state": "dead", "served_name": MODEL}),
    status.Answer("spark-04", error="unreachable: cannot connect over SSH (timeout)"),
]
KEY = {"spark-01": ("active/running", "healthy", "3h 12m", "Qwen3.6-35B-A3B-NVFP4"),
       "spark-02": ("active/running", "unhealthy", "5m 03s", "Qwen3.6-35B-A3B-NVFP4"),
       "spark-03": ("activating/start", "starting", "42s", "Qwen3.6-35B-A3B-NVFP4"),
       "spark-arm64-01": ("inactive/dead",), "spark-04": ("no answer",)}


@pytest.fixture(autouse=True)
def _no_forced_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """rich treats any output as a terminal when these are set; the tests say which they want."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)


def _console(terminal: bool, width: int = 80) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=width, force_terminal=terminal, color_system="standard" if terminal else None), out


def _status(terminal: bool, width: int = 80, wide: bool = False) -> list[str]:
    console, out = _console(terminal, width)
    status.render(ANSWERS, console, wide)
    return out.getvalue().splitlines()


def _row(lines: list[str], host: str) -> str:
    return next(line for line in lines if line.startswith(host + " "))


def test_status_at_80_columns_keeps_the_key_columns_whole_and_folds_the_rest() -> None:
    lines = [ANSI.sub("", line) for line in _status(terminal=True)]
    assert max(cell_len(line) for line in lines) <= 80, "\n".join(lines)
    assert "…" not in "\n".join(lines)
    header = lines[1].split()
    assert header[:4] == ["host", "endpoint", "health", "uptime"] and "model" in header and "served" not in header
    for host, cells in KEY.items():  # each a whole cell, space-separated from the next
        assert all(re.search(rf"(^|\s){re.escape(cell)}(\s|$)", _row(lines, host)) for cell in cells), host
    # Folded, not lost: under spark-02's row, whatever its row has no room for.
    below = lines[lines.index(_row(lines, "spark-02")) + 1:lines.index(_row(lines, "spark-03"))]
    details = " ".join(below)
    assert all(line.startswith("  ") for line in below)
    for pair in ("restarts: 3", "image: vllm-openai:v0.28.0", "KV cache: 12.5%", "MTP accept: 82.3%",
                 f"served name: {MODEL}", f"last alert: {ALERT}"):
        assert pair in details, details
    assert lines[-1] == "spark-04: unreachable: cannot connect over SSH (timeout)"


def test_a_wider_terminal_shows_more_columns() -> None:
    lines = _status(terminal=False, width=120)
    assert max(len(line) for line in lines) <= 120
    assert "vllm-openai:v0.28.0" in _row(lines, "spark-01") and "restarts" in lines[1]
    assert any(f"last alert: {ALERT}" in line for line in lines)


def test_wide_keeps_every_column_in_the_row() -> None:
    lines = _status(terminal=False, width=80, wide=True)
    assert [column.header for column in status.COLUMNS] == [
        header.strip() for header in re.split(r"\s{2,}", lines[1].strip())]
    row = _row(lines, "spark-02")
    assert all(cell in row for cell in ("unhealthy", "vllm-openai:v0.28.0", "82.3%", MODEL, ALERT))
    assert not any(line.startswith("  ") for line in lines)  # nothing folded


def test_status_off_a_terminal_is_plain_text() -> None:
    for wide in (False, True):
        text = "\n".join(_status(terminal=False, wide=wide))
        assert "\x1b" not in text and not BOX_DRAWING.search(text), text
        assert "active/running" in text and "no answer" in text
    coloured = "\n".join(_status(terminal=True))
    assert "\x1b[" in coloured and "─" in coloured  # the same table on a terminal: colour and a header rule


def test_every_command_table_is_plain_off_a_terminal_and_fits_80_columns() -> None:
    spark = endpoint()
    reports = [doctor.HostReport("spark-01", doctor.host_rows(spark, facts()), spark, facts())]
    plan = rollout.Rollout([["spark-01"], ["spark-02"]])
    plan.results = {"spark-01": rollout.HostResult("spark-01", 0, "rolled-back", "FP8 kernels crash on GB10 "
                                                   "with this image (cutlass_scaled_mm: Error Internal): " * 3),
                    "spark-02": rollout.HostResult("spark-02", 1, "skipped", "not touched: batch 1 failed")}
    for terminal in (False, True):
        console, out = _console(terminal)
        doctor.render(reports, console, explain_budget=True)
        console.print(rollout.summary_table(plan, console))
        console.print(bench.summary_table([record()], console))
        text = ANSI.sub("", out.getvalue())
        assert max(cell_len(line) for line in text.splitlines()) <= 80
        assert "cutlass_scaled_mm" in text and "rolled-back" in text and "memory budget" in text
        if not terminal:
            assert "\x1b" not in out.getvalue() and not BOX_DRAWING.search(text), text


def test_a_hosts_words_are_never_read_as_markup() -> None:
    answer = status.Answer("spark-01", _serving(last_alert={"time": "t", "cause": "down [oom-kill]"}))
    console, out = _console(terminal=False)
    status.render([answer], console, wide=True)
    assert "t down [oom-kill]" in out.getvalue()
