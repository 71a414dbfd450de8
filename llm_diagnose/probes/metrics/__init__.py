"""Live attach to a serving engine's Prometheus /metrics.

Pipeline: `scraper` GETs pages on an interval and appends them to the run folder ->
`exposition` parses each into a `Scrape` -> `window` turns a series of scrapes into counter
increases, gauge series and histogram deltas -> `engines` says which names an engine uses
for each concept -> `passive` produces the evidence keys of llm_diagnose.probes.quantities.
"""

from llm_diagnose.probes.metrics.engines import ENGINE_METRICS, EngineGuess, Sel, detect_engine
from llm_diagnose.probes.metrics.exposition import HistogramSeries, Scrape, Series, parse_exposition
from llm_diagnose.probes.metrics.histogram import QuantileEstimate, histogram_quantile, summary_from_buckets
from llm_diagnose.probes.metrics.passive import PASSIVE_KEYS, passive_evidence
from llm_diagnose.probes.metrics.scraper import Scraper, scrape_once, scrape_window
from llm_diagnose.probes.metrics.window import METRICS_FILE, CounterIncrease, HistogramIncrease, ScrapeRecord, Window
from llm_diagnose.probes.stats import spearman

__all__ = [
    "ENGINE_METRICS",
    "EngineGuess",
    "Sel",
    "detect_engine",
    "HistogramSeries",
    "Scrape",
    "Series",
    "parse_exposition",
    "QuantileEstimate",
    "histogram_quantile",
    "summary_from_buckets",
    "PASSIVE_KEYS",
    "passive_evidence",
    "spearman",
    "Scraper",
    "scrape_once",
    "scrape_window",
    "METRICS_FILE",
    "CounterIncrease",
    "HistogramIncrease",
    "ScrapeRecord",
    "Window",
]
