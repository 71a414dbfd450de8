"""REAL ENGINE: `run --active --replay` of an earlier active run's inputs.jsonl against the tiny vLLM.

The first run sends two experiments (decode, prefix); the second replays its inputs.jsonl into
another folder. The replay must send the same bodies (same server, same model name: no substitution)
in the same order, at the recorded offsets (within the tolerances below) unless the replay itself
says it did not keep time because the host starved its client, and every replayed request must
complete.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from llm_diagnose.diagnose.cli import main
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.load.records import INPUTS_FILE, REQUESTS_FILE
from llm_diagnose.probes.load.replay_inputs import REPLAY_EXPERIMENT

pytestmark = pytest.mark.real_engine

# How far a replayed send may land from its recorded offset (both from each run's first send).
# Measured on the 2-core test host with the engine on the same cores (host CPUs 99-100% busy, the
# client's event-loop lag p99 ~200 ms), 57 requests: median |error| 0.6 ms, p90 0.20 s, worst
# 0.30 s, every one of them late, none early by more than 1 ms. The late ones come in episodes
# (a burst of 8 concurrent streams, the requests right after it): the client's timers firing late
# on a starved host, not the plan. So: no send leaves early; the bulk is on time; a starved host
# may delay a send by a few tenths of a second. A full-suite run on the same host, busier (the
# suite's other servers), then measured 56 requests at median 2.7 ms, p90 1.08 s, worst 1.48 s, in
# the same burst episodes: the late tail is the host's scheduling of the client, which the median
# and the no-early rule still pin; the per-send bound is the worst seen with a margin.
# CI then measured 33 requests at median 180 ms, worst 1.17 s: the client's event loop stalled for
# up to 1.8 s (0.05 client cores, host 99% busy) and every send due in a stall left at its end.
# The replay now measures its lateness itself (replay.send_lateness_p50_s) and warns when it did
# not keep time; these tolerances hold for a replay that did not warn.
EARLY_TOLERANCE_S = 0.01
MEDIAN_TOLERANCE_S = 0.05
LATE_TOLERANCE_S = 2.5


def _run(server, out: Path, *extra: str) -> None:
    argv = ["run", "--url", server.url, "--out", str(out), "--duration", "4", "--interval", "0.5", "--quiet", *extra]
    code = main(argv)
    assert code == 0, (code, (out / "summary.txt").read_text() if (out / "summary.txt").exists() else "")


def _first_sends(folder: Path) -> list[dict]:
    lines = [json.loads(line) for line in (folder / INPUTS_FILE).read_text().splitlines() if line.strip()]
    return [line for line in lines if line["send"] == 1]


def test_a_replay_sends_the_same_bodies_at_the_same_offsets(vllm_server, tmp_path):
    before, after = tmp_path / "before", tmp_path / "after"
    _run(
        vllm_server, before, "--active", "--experiments", "decode,prefix", "--budget-requests", "40",
        "--budget-seconds", "16",
    )  # fmt: skip
    original = _first_sends(before)
    assert len(original) >= 10, "the first run sent too little to replay"
    _run(
        vllm_server, after, "--active", "--replay", str(before / INPUTS_FILE), "--budget-requests", "200",
        "--budget-seconds", "45",
    )  # fmt: skip
    replayed = _first_sends(after)

    # The same bodies (same server and model name: no substitution), one per original request.
    assert sorted(r["request_id"] for r in replayed) == sorted(r["request_id"] for r in original)
    by_id = {r["request_id"]: r for r in original}
    assert all(r["body"] == by_id[r["request_id"]]["body"] for r in replayed)
    assert all(r["experiment"] == REPLAY_EXPERIMENT for r in replayed)
    assert all(r["phase"].startswith(by_id[r["request_id"]]["experiment"]) for r in replayed)

    # At the recorded offsets (each from its run's first send), so in the same order up to sends
    # recorded closer together than the tolerance (a burst may leave in another order).
    t0_before, t0_after = original[0]["t_offset_s"], replayed[0]["t_offset_s"]
    errors = {
        r["request_id"]: (r["t_offset_s"] - t0_after) - (by_id[r["request_id"]]["t_offset_s"] - t0_before)
        for r in replayed
    }
    abs_errors = sorted(abs(e) for e in errors.values())
    summary = {
        "requests": len(abs_errors),
        "median_s": round(statistics.median(abs_errors), 4),
        "p90_s": round(abs_errors[int(0.9 * (len(abs_errors) - 1))], 4),
        "max_s": round(abs_errors[-1], 4),
        "mean_s": round(statistics.fmean(errors.values()), 4),
        "earliest_s": round(min(errors.values()), 4),
    }
    (tmp_path / "offset-errors.json").write_text(json.dumps({"summary": summary, "errors": errors}, indent=1))
    print(f"replay offset error: {summary}")
    # The replay measures its own punctuality (the most punctual send taken as on time): it must
    # agree with this test's reading, and say when it did not keep time, and why.
    lateness = json.loads((after / "evidence.json").read_text())["items"][Q.REPLAY_SEND_LATENESS_P50]
    shifted = statistics.median(e - min(errors.values()) for e in errors.values())
    assert lateness["value"] == pytest.approx(shifted, abs=0.005), (lateness, summary)
    if lateness.get("warnings"):
        # A client the host did not schedule (seen in CI: loop stalls of 1.8 s at 0.05 client cores,
        # host 99% busy) sends all that fell due during a stall at its end: no replay can keep time
        # then. Late without a starved client would be the replay's own fault.
        assert Q.CLIENT_STARVED_WARNING in lateness["warnings"][0], lateness
    else:
        assert min(errors.values()) >= -EARLY_TOLERANCE_S, summary
        assert summary["median_s"] <= MEDIAN_TOLERANCE_S, summary
        assert summary["max_s"] <= LATE_TOLERANCE_S, summary
    recorded = [by_id[r["request_id"]]["t_offset_s"] for r in replayed]
    assert all(b >= a - LATE_TOLERANCE_S for a, b in zip(recorded, recorded[1:])), "sent out of order"

    # One completed record per replayed request.
    records = [json.loads(line) for line in (after / REQUESTS_FILE).read_text().splitlines() if line.strip()]
    assert sorted(r["request_id"] for r in records) == sorted(errors)
    assert all(r["experiment"] == REPLAY_EXPERIMENT for r in records)
    incomplete = [r["request_id"] for r in records if r["fault"] is not None or r["finish_reason"] is None]
    assert not incomplete, incomplete
