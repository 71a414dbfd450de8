"""The HTML report in a real browser: headless Chromium (Debian's `chromium` package) opens it.

Each test drives Chromium through the DevTools protocol (a websocket, spoken with aiohttp):
it loads the page from a file:// URL, collects console errors, exceptions, CSP reports,
JavaScript dialogs and every network request, asks the page's DOM what it shows, and takes a
screenshot (saved beside the test; copied to $LLMD_ARTIFACTS_DIR when that is set, for a
person to look at). A missing Chromium fails the tests: install it with
`apt-get install -y chromium`.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import signal
import struct
import subprocess
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from llm_diagnose.diagnose.report import html
from llm_diagnose.diagnose.runfolder import RunFolder
from llm_diagnose.diagnose.tree import diagnose
from tests.test_report_samples import FAKE_PROMPT, XSS, hostile_evidence, rich_evidence, write_run

pytestmark = pytest.mark.timeout(120)

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
    "--window-size=1280,1400",
)
PAGE_TIMEOUT_S = 60

# What the page shows, asked of the browser's DOM (not of the file's text).
PROBE_JS = """(() => {
  const box = el => { const r = el.getBoundingClientRect(); return {top: r.top, width: r.width, height: r.height}; };
  const verdict = document.querySelector('#verdict');
  return {
    title: document.title,
    verdict: verdict ? verdict.innerText : null,
    verdictBox: verdict ? box(verdict) : null,
    viewport: window.innerHeight,
    sections: [...document.querySelectorAll('body > section')].map(s => s.id),
    figures: [...document.querySelectorAll('#plots figure')].map(f => {
      const svg = f.querySelector('svg');
      return {id: f.id, drawn: f.classList.contains('drawn'), svgBox: svg ? box(svg) : null,
              marks: svg ? svg.querySelectorAll('circle, rect, polyline, line').length : 0,
              missing: (f.querySelector('.not-measured') || {}).innerText || ''};
    }),
    scripts: document.querySelectorAll('script').length,
    xss: typeof window.__xss_ran,
    text: document.body.innerText,
  };
})()"""


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("the HTML report tests need headless Chromium: apt-get install -y chromium", pytrace=False)
    return path


@dataclass
class Visit:
    facts: dict
    errors: list[str]  # console errors, exceptions, CSP and other error-level log entries
    requests: list[str]  # every URL the page asked for beyond its own file
    dialogs: list[str]  # alert()/confirm() that opened
    screenshot: Path


class _Cdp:
    """The smallest DevTools client: numbered calls, events kept as they come."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.next_id, self.events = ws, 0, []

    async def _receive(self) -> dict:
        msg = await self.ws.receive()
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise RuntimeError(f"DevTools connection ended: {msg.type}")
        return msg.json()

    async def call(self, method: str, **params) -> dict:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            msg = await self._receive()
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    async def until(self, method: str) -> None:
        while not any(e.get("method") == method for e in self.events):
            self.events.append(await self._receive())


def _wait_for_port(profile: Path, proc: subprocess.Popen, log: Path) -> int:
    marker = profile / "DevToolsActivePort"  # Chromium writes its chosen port here
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        if marker.exists() and marker.read_text().strip():
            return int(marker.read_text().splitlines()[0])
        time.sleep(0.1)
    raise RuntimeError(f"chromium gave no DevTools port within 30 s: {log.read_text(errors='replace')[-2000:]}")


async def _drive(port: int, url: str, shot: Path) -> Visit:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/json/list") as resp:
            page = next(t for t in await resp.json() if t["type"] == "page")
        async with session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            cdp = _Cdp(ws)
            for domain in ("Page", "Runtime", "Log", "Network"):
                await cdp.call(f"{domain}.enable")
            await cdp.call("Page.navigate", url=url)
            await cdp.until("Page.loadEventFired")
            facts = (await cdp.call("Runtime.evaluate", expression=PROBE_JS, returnByValue=True))["result"]["value"]
            png = await cdp.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            shot.write_bytes(base64.b64decode(png["data"]))
            await cdp.call("Runtime.evaluate", expression="0")  # drain events raised meanwhile
    errors, requests, dialogs = [], [], []
    for e in cdp.events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.exceptionThrown":
            errors.append(str(p.get("exceptionDetails", {}).get("text")))
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
            errors.append(f"console.{p['type']}: {p.get('args')}")
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
            errors.append(f"log {p['entry'].get('source')}: {p['entry'].get('text')}")
        elif method == "Network.requestWillBeSent" and p.get("request", {}).get("url") != url:
            requests.append(p["request"]["url"])
        elif method == "Page.javascriptDialogOpening":
            dialogs.append(str(p.get("message")))
    return Visit(facts, errors, requests, dialogs, shot)


def visit(page: Path, work: Path) -> Visit:
    """Open `page` in a fresh headless Chromium and report what it did and showed."""
    profile, log = work / "chromium-profile", work / "chromium.log"
    profile.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as log_fh:
        proc = subprocess.Popen(
            [chromium_path(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        port = _wait_for_port(profile, proc, log)
        shot = work / f"{page.stem}.png"
        result = asyncio.run(asyncio.wait_for(_drive(port, page.resolve().as_uri(), shot), PAGE_TIMEOUT_S))
    finally:
        # Chromium's own process group (start_new_session): its renderer and GPU helpers go with it.
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    artifacts = os.environ.get("LLMD_ARTIFACTS_DIR")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(result.screenshot, Path(artifacts) / result.screenshot.name)
    return result


def png_facts(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct byte values of the decoded pixels): a blank page has very few."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    pos, idat = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        if data[pos + 4 : pos + 8] == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    return width, height, len(set(zlib.decompress(idat)[:4_000_000]))


def _write_page(tmp_path: Path, evidence, name: str, *, run_dir=None, include_prompts=False) -> Path:
    page = tmp_path / f"{name}.html"
    run = RunFolder.load(run_dir) if run_dir is not None else None
    page.write_text(
        html.render(diagnose(evidence), evidence, run=run, include_prompts=include_prompts), encoding="utf-8"
    )
    return page


def test_report_opens_without_errors_and_shows_the_verdict_first_and_every_plot(tmp_path):
    run_dir = write_run(tmp_path / "run", rich_evidence())
    v = visit(_write_page(tmp_path, rich_evidence(), "rich", run_dir=run_dir), tmp_path)
    assert v.errors == [] and v.dialogs == []
    assert v.requests == [], "a self-contained page fetches nothing"
    f = v.facts
    assert f["sections"][0] == "verdict" and f["sections"][-1] == "provenance"
    assert f["sections"] == ["verdict", "plots", "path", "pitfalls", "not-measured", "techniques", "provenance"]
    assert "Bottleneck: Q2" in f["verdict"] and "prefix-caching" in f["verdict"]
    assert "--enable-prefix-caching" in f["verdict"], "the exact setting to change is in the verdict"
    assert "Expect:" in f["verdict"]
    assert 0 <= f["verdictBox"]["top"] < f["viewport"], "the verdict is on the first screen"
    ids = [x["id"] for x in f["figures"]]
    assert ids == ["fig-output-lengths", "fig-itl-over-time", "fig-memory", "fig-prefix-reuse", "fig-decode-vs-batch"]
    for fig in f["figures"]:
        assert fig["drawn"] and fig["svgBox"]["width"] > 300 and fig["svgBox"]["height"] > 100, fig["id"]
        assert fig["marks"] > 5, f"{fig['id']} draws something"
    assert "GPU0 NVIDIA H100" in f["text"] and "tool version" in f["text"]
    width, height, distinct = png_facts(v.screenshot)
    assert width > 1000 and height > 2000 and distinct > 50, "the screenshot shows a full, coloured page"


def test_figures_without_data_say_not_measured_and_why(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    evidence = rich_evidence()
    (run_dir / "diagnosis.json").write_text(diagnose(evidence).to_json(), encoding="utf-8")
    from llm_diagnose.diagnose.runfolder import load_run

    loaded = load_run(run_dir / "diagnosis.json")  # no evidence.json beside it: nothing to plot
    page = tmp_path / "bare.html"
    page.write_text(html.render(loaded.diagnosis, loaded.evidence, run=loaded.folder), encoding="utf-8")
    v = visit(page, tmp_path)
    assert v.errors == [] and v.requests == []
    assert all(not fig["drawn"] and fig["missing"].startswith("not measured:") for fig in v.facts["figures"])
    itl = next(fig for fig in v.facts["figures"] if fig["id"] == "fig-itl-over-time")
    assert "requests.jsonl" in itl["missing"] and "--active" in itl["missing"]
    assert "Bottleneck:" in v.facts["verdict"]


def test_markup_in_evidence_is_shown_as_text_never_run_and_prompts_are_withheld(tmp_path):
    evidence = hostile_evidence()
    v = visit(_write_page(tmp_path, evidence, "hostile", run_dir=write_run(tmp_path / "run", evidence)), tmp_path)
    assert v.dialogs == [] and v.errors == [] and v.requests == []
    assert v.facts["scripts"] == 0 and v.facts["xss"] == "undefined"
    text = v.facts["text"]
    assert XSS in text, "the markup is displayed as the literal text it is"
    assert "evil|model" in text
    assert FAKE_PROMPT not in text and "helpful bot" not in text, "prompt text stays out of the report"
    assert "prompt text withheld: sha256" in text


def test_prompts_asked_for_are_shown_escaped(tmp_path):
    evidence = hostile_evidence()
    v = visit(_write_page(tmp_path, evidence, "with-prompts", include_prompts=True), tmp_path)
    assert v.dialogs == [] and v.errors == [] and v.facts["scripts"] == 0
    assert FAKE_PROMPT in v.facts["text"]
