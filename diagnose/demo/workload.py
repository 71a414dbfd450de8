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

from probes.load.client import StreamingClient
from probes.load.records import RequestSpec

SYSTEM_PROMPT = " ".join(
    f"Rule {i}: answer politely, cite the policy section {i}, and keep the tone of the support desk."
    for i in range(1, 41)
)


@dataclass(frozen=True)
class DemoWorkload:
    requests: int = 48
    concurrency: int = 6
    seed: int = 7

    def specs(self) -> list[RequestSpec]:
        rng = random.Random(self.seed)
        out = []
        for i in range(self.requests):
            question = f"User {rng.randrange(10_000)} asks about order {rng.randrange(10**6)}: where is it?"
            # Heavy-tailed output lengths (a few long answers among many short ones).
            max_tokens = min(400, int(8 + rng.paretovariate(1.2) * 12))
            out.append(RequestSpec(request_id=f"demo-{i}", prompt=f"{SYSTEM_PROMPT}\n\n{question}",
                                   max_tokens=max_tokens, experiment="demo", tag="shared-system-prompt"))
        return out

    def write_trace(self, path: Path) -> Path:
        with path.open("w", encoding="utf-8") as f:
            for spec in self.specs():
                f.write(json.dumps({"prompt": spec.prompt, "output_length": spec.max_tokens}) + "\n")
        return path

    async def drive(self, base_url: str, model: str, delay_s: float = 1.0) -> int:
        """Send every request with at most `concurrency` in flight; return how many completed."""
        await asyncio.sleep(delay_s)  # let the scraper take a baseline first
        sem = asyncio.Semaphore(self.concurrency)
        done = 0
        async with StreamingClient(base_url, model, max_streams=self.concurrency) as client:
            async def one(spec: RequestSpec) -> None:
                nonlocal done
                async with sem:
                    record = await client.send(spec)
                    done += record.completed
            await asyncio.gather(*(one(s) for s in self.specs()))
        return done
