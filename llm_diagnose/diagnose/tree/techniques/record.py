"""`Technique`: everything the tool knows about one remedy, in one record.

What it fixes, the settings that turn it on per engine, its rank in the headline, what it
promises (its claims, from which the expect text is generated), how verify sees it adopted
(the on/off `switch` fact, the settings it is `tuned_by`), the path node that records it on,
the claim it acts through, and what it can make worse. Each technique's record is in its own
file beside this one; `catalogue.TECHNIQUES` lists them.
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_diagnose.diagnose.tree.techniques.claim import ALL_PARTS, Claim, Part
from llm_diagnose.diagnose.tree.techniques.expect import expect_text
from llm_diagnose.diagnose.tree.techniques.setting import Setting

__all__ = ["Technique"]


@dataclass(frozen=True)
class Technique:
    id: str  # the stable identifier a diagnosis and verify report name it by
    name: str
    fixes: str
    # Headline order among techniques (llm_diagnose.diagnose.tree.headline): lower is more
    # consequential; spaced by tens so a new technique slots in without renumbering.
    rank: int
    claims: tuple[Claim, ...]
    options: tuple[tuple[str, tuple[Setting, ...]], ...]  # (engine, settings) in ENGINES order
    # The path node where the tree records whether it is switched on ("" where it is no switch).
    on_node: str = ""
    # The configuration fact whose off-or-absent -> on says it was turned on (verify).
    switch: str = ""
    # Configuration facts whose known value changing says it was turned on or re-tuned (verify).
    tuned_by: tuple[str, ...] = ()
    # The claim key through which it acts: when that did not move, its other claims cannot be
    # credited to it, whatever they did ("" for none singled out).
    mechanism: str = ""
    # The parts of serving its mechanism can make worse, and why not the rest ("" where it can
    # make anything worse: it acts on every step).
    worsens: frozenset[Part] = ALL_PARTS
    worsens_why: str = ""

    @property
    def expect(self) -> str:
        """Which measurements should improve, and which way: read from the claims."""
        return expect_text(self.claims)

    @property
    def references(self) -> tuple[str, ...]:
        """Keys the expect text names as a target to move towards, not as claims."""
        return tuple(c.towards for c in self.claims if c.towards)

    @property
    def settings(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The settings as printed: (engine, lines) in ENGINES order."""
        return tuple((e, tuple(str(s) for s in ss)) for e, ss in self.options)

    def settings_for(self, engine: str) -> tuple[Setting, ...]:
        return dict(self.options).get(engine, ())
