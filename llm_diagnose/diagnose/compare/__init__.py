"""The comparison core: one metric of two runs, the statistic it names, the bootstrap change of it,
against the tolerances of the one registry (`llm_diagnose.diagnose.tolerances`, a module of its
own below everything that reads it: the tree's technique claims start from its defaults). The
gate (`llm_diagnose.diagnose.gate`) and verify (`llm_diagnose.diagnose.verify`) are built on it.

`statistic` (which statistic a key names), `change` (the change between runs, its bootstrap
interval), `settings` (the bootstrap's settings and the tolerances in force, passed to every
comparison), `rules` (per quantity: which way is better, its own tolerance; the default
metrics), `outcome` (one comparison's verdict), `metric` (`compare_metric`), `client_engine`
(the client/engine cross-check), `request_measurements` (a run's request records as
per-request samples).
"""

from llm_diagnose.diagnose.compare.metric import compare_metric
from llm_diagnose.diagnose.compare.outcome import VERDICTS, Outcome, Verdict
from llm_diagnose.diagnose.compare.rules import DEFAULT_METRICS, MetricRule
from llm_diagnose.diagnose.compare.settings import CompareSettings

__all__ = [
    "compare_metric",
    "Outcome",
    "Verdict",
    "VERDICTS",
    "MetricRule",
    "DEFAULT_METRICS",
    "CompareSettings",
]
