"""The decision tree: pure functions over evidence, no I/O (files, sockets, processes, GPUs).

`walk.diagnose(evidence, thresholds)` is the entry; every other module here is one part of the
judgement it walks through (see `walk`'s docstring for the order). The layer contract test
(tests/test_layers.py) keeps this package free of network, process and device imports.
"""

from llm_diagnose.diagnose.tree.walk import diagnose

__all__ = ["diagnose"]
