"""The demo's own traffic: a small chat-like workload with a shared system prompt.

It plays the users of the demo server (never a server of anyone else): every request starts
with the same long system prompt, longer than several 128-token KV blocks so vLLM CPU's
prefix cache can hit, then a short per-user question; output lengths are heavy-tailed.
The prompts are also written as a prompt-text JSONL trace, so the diagnosis can measure the
workload's own prefix reuse beside the server's counters.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from pathlib import Path

from llm_diagnose.probes.load.client import StreamingClient
from llm_diagnose.probes.load.health import ClientHealth, HealthWindow, TargetHost
from llm_diagnose.probes.load.records import JsonlWriter, RequestSpec

# About 820 tokens with the tiny model's tokenizer: six full 128-token blocks, well inside
# the demo server's 2048-token context together with the question and the answer.
WARM_UP_REQUESTS = 8  # enough for the first-request costs seen on vLLM CPU (about 3 s of traffic)
SYSTEM_PROMPT = " ".join(
    f"Rule {i}: answer politely, cite the policy section {i}, and keep the tone of the support desk."
    for i in range(1, 17)
)


@dataclass(frozen=True)
class DemoWorkload:
    requests: int = 96
    concurrency: int = 8
    spread_s: float = 15.0  # arrivals are spread over this long, so every scrape interval sees traffic
    seed: int = 7
    system_prompt: str = SYSTEM_PROMPT  # "" : questions alone, nothing shared (the verify tests' other workload)

    def specs(self) -> list[RequestSpec]:
        rng = random.Random(self.seed)
        out = []
        for i in range(self.requests):
            question = f"User {rng.randrange(10_000)} asks about order {rng.randrange(10**6)}: where is it?"
            # Heavy-tailed output lengths (a few long answers among many short ones).
            max_tokens = min(400, int(8 + rng.paretovariate(1.2) * 12))
            out.append(
                RequestSpec(
                    request_id=f"demo-{i}",
                    prompt=f"{self.system_prompt}\n\n{question}" if self.system_prompt else question,
                    max_tokens=max_tokens,
                    experiment="demo",
                    tag="shared-system-prompt" if self.system_prompt else "question-only",
                )
            )
        return out

    def write_trace(self, path: Path) -> Path:
        with path.open("w", encoding="utf-8") as f:
            for spec in self.specs():
                f.write(json.dumps({"prompt": spec.prompt, "output_length": spec.max_tokens}) + "\n")
        return path

    def warm_up_workload(self) -> DemoWorkload:
        """Unrecorded traffic for a freshly started server, of this workload's shape and sharing
        none of its prefixes.

        A vLLM CPU server serves its first requests several times slower than later ones (seen:
        TTFT 152 ms in a first run, 28 ms later; CI: a run on a second fresh server decoded 29%
        slower per token than on the first), and how much varies from one start to the next: a
        before/after pair of cold servers compares two warm-ups. The warm-up's system prompt is
        this one behind a different first line: prefix caches match exact prefixes block by
        block from the start, so nothing it leaves in the cache serves the recorded requests
        (a warm cache would read as the change's effect, and as the warm-cache pitfall).
        """
        warm_prompt = f"(warm-up, not recorded)\n{self.system_prompt}" if self.system_prompt else ""
        return DemoWorkload(requests=WARM_UP_REQUESTS, concurrency=self.concurrency, spread_s=0.5,
                            seed=self.seed + 1, system_prompt=warm_prompt)  # fmt: skip

    def warm_up(self, base_url: str, model: str, scratch: Path) -> int:
        """Send the warm-up workload (its records go to `scratch`, not the run folder); the number
        of its requests that completed."""
        completed, _, _ = asyncio.run(self.warm_up_workload().drive(base_url, model, scratch, delay_s=0.0))
        return completed

    async def drive(
        self, base_url: str, model: str, requests_file: Path, delay_s: float = 1.0
    ) -> tuple[int, int, ClientHealth]:
        """Send every request with at most `concurrency` in flight, recording each one in
        `requests_file` as it ends; return (completed, failed) and how the client and the host
        fared meanwhile (other processes on the host take CPU from a server that shares it)."""
        await asyncio.sleep(delay_s)  # let the scraper take a baseline first
        sem = asyncio.Semaphore(self.concurrency)
        done = 0
        writer = JsonlWriter(requests_file)
        async with StreamingClient(
            base_url, model, max_streams=self.concurrency, on_record=lambda r: writer.write(r.to_dict())
        ) as client:

            async def one(i: int, spec: RequestSpec) -> None:
                nonlocal done
                await asyncio.sleep(i * self.spread_s / self.requests)
                async with sem:
                    record = await client.send(spec)
                    done += record.completed

            async with HealthWindow(client.counters, TargetHost.of(base_url)) as window:
                await asyncio.gather(*(one(i, s) for i, s in enumerate(self.specs())))
        writer.close()
        assert window.health is not None
        return done, self.requests - done, window.health
