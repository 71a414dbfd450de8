"""A real vLLM CPU server as slow as a large model on a GPU, already serving another client
(issue 26): the default `run --active` finishes every experiment inside its default budget, keeps
what the server served beside what the experiments measured, and says which verdicts were made
beside other traffic.

The server serves the recipe's "small" model (23 M random parameters, llm_diagnose/diagnose/demo/
tiny_model.py) under vLLM's default scheduler limits (the session's small-model server, shared with
test_small_model_live.py, which runs next): beside the other
client's four streams it takes tens of ms per token on this 2-core host (the calibration's figure
is asserted). The recipe's "slow" model (~162 M) took 115-130 ms per token there beside two to four
streams, past what a 60 s budget can hold for every experiment (the run then skips the last ones
and says what budget would hold them). The other client is four closed-loop streams from a thread
of this test, running before the run starts (seen in flight on the server) and until it ends. One
server, one run: the assertions share it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.runfolder import RunFolder
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.experiments import EXPERIMENT_KEYS
from llm_diagnose.probes.results import Measurement, NotMeasured
from tests.conftest import small_server_flags
from tests.test_cli_run_demo import requests_in_flight, wait_idle
from tests.test_judgement_live import closed_loop

pytestmark = pytest.mark.real_engine

OTHER_STREAMS = 4  # the other client's requests in flight, as in the issue
SLOW_TOKEN_S = 0.010  # at least this per token alone: the regime of a large model on a GPU (20-40 ms)


def other_clients_request(i: int) -> dict:
    return {"prompt": f"other client {i}: " + " ".join(f"w{j % 11}" for j in range(40)), "max_tokens": 48}


@pytest.fixture(scope="module")
def slow_server(vllm_server_factory, small_model_dir):
    """The session's small-model server (test_small_model_live.py, next, uses it too);
    nothing has been sent to it before this module: no module before this one asks for it."""
    return vllm_server_factory(**small_server_flags(small_model_dir))


@pytest.fixture(scope="module")
def busy_run(slow_server, tmp_path_factory):
    """`llm-diagnose run --active` with its defaults while another client keeps four streams going."""
    out = tmp_path_factory.mktemp("slow-run") / "run"
    with closed_loop(slow_server, OTHER_STREAMS, other_clients_request) as load:
        _wait_for_others(slow_server.url)  # the run reads the server's load before it sends: let it see them
        code = main(["run", "--url", slow_server.url, "--out", str(out), "--active", "--quiet"])
    wait_idle(slow_server.url)  # the other client's last requests are aborted: the next module finds it idle
    assert load.completed > 0 and not load.errors, (load.completed, load.errors[:3])
    return code, out, RunFolder.load(out)


def _wait_for_others(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if requests_in_flight(url) >= 1:
            return
        time.sleep(0.2)
    raise AssertionError(f"the other client's requests never showed as running on {url}")


def _events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines() if line.strip()]


# Calibrated at or below this, the plan itself holds every experiment in the default 60 s (measured:
# 25-32 ms per token planned all five; the last ended at 48 s). The band depends on the calibration
# alone, which fixes the plan. Above it the plan leaves the last ones out and sizes them again in what
# the others left unused (tests/test_experiments_leftover.py holds that on a stand-in clock; one full
# run here calibrated 55 ms and its four planned experiments ended at 41 s, leaving 19 s for spec's
# floor of about 6 s), so whether they run then depends on how long the others took: the test holds
# the run to running them or saying, with a budget that would hold them, that they did not run.
ALL_FIT_BELOW_S = 0.035


def test_every_experiment_finishes_inside_the_default_budget(busy_run):
    code, out, folder = busy_run
    assert code == 0, (out / "summary.txt").read_text()
    events = _events(out)
    sized = next(e for e in events if e.get("event") == "experiments-sized")
    resized = [e for e in events if e.get("event") == "experiments-resized"]
    left_out = resized[-1]["skipped"] if resized else sized["skipped"]
    calibration = folder.evidence.items.get(Q.CALIBRATION_ITL)
    assert isinstance(calibration, Measurement) and calibration.value >= SLOW_TOKEN_S, calibration
    if calibration.value <= ALL_FIT_BELOW_S:
        assert not sized["skipped"], sized["skipped"]  # nothing sized out of the budget: every experiment ran
    for skipped in left_out:  # each says which budget would hold it, and it is over the default
        need = float(skipped["hint"].rsplit("at least ", 1)[1].split()[0])
        assert need > 60, skipped
    ended = {e["experiment"] for e in events if e.get("event") == "experiment-end"}
    ran = set(EXPERIMENT_KEYS) - {s["experiment"] for s in left_out}
    assert ended == ran, ended
    items = folder.evidence.items
    lost = {
        k: r.reason
        for name in ran
        for k in EXPERIMENT_KEYS[name]
        if isinstance(r := items.get(k), NotMeasured) and ("did not finish" in r.reason or "did not run" in r.reason)
    }
    assert not lost, lost


def test_what_the_server_served_is_kept_beside_what_the_experiments_measured(busy_run):
    _, _, folder = busy_run
    items = folder.evidence.items
    served, batch1 = items.get(Q.ITL_P50), items.get(Q.DECODE_BATCH1_ITL_P50)
    assert isinstance(served, Measurement) and not served.provenance.method.startswith("active"), served
    assert isinstance(batch1, Measurement) and batch1.provenance.method.startswith("active-probe/decode"), batch1


def test_verdicts_made_beside_other_traffic_say_so(busy_run):
    _, out, folder = busy_run
    items = folder.evidence.items
    at_start = items.get(Q.SERVER_REQUESTS_AT_START)
    assert isinstance(at_start, Measurement) and at_start.value >= 1, at_start
    assert (out / "summary.txt").read_text().startswith("SERVER ALREADY BUSY AT START")
    shared = [
        k
        for keys in EXPERIMENT_KEYS.values()
        for k in keys
        if isinstance(m := items.get(k), Measurement) and any(w.startswith(Q.OTHER_TRAFFIC_WARNING) for w in m.warnings)
    ]
    assert Q.DECODE_BATCH1_ITL_P50 in shared, shared
    assert any(e.get("event") == "beside-other-traffic" for e in _events(out))
    diagnosis = folder.diagnosis
    assert diagnosis is not None
    said = [a for a in diagnosis.answers if "measured beside other clients' traffic" in a.rationale]
    assert said, [(a.question, a.rationale) for a in diagnosis.answers]
    assert all(a.confidence <= 0.6 for a in said)
