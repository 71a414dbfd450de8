"""llm-diagnose: profiling-driven bottleneck diagnosis for LLM serving.

Two packages under one collision-free name: `llm_diagnose.probes` measures (scrapes, load,
traces, timing; it never imports `diagnose`) and `llm_diagnose.diagnose` judges (the decision
tree over evidence, reports, gate, verify, the CLI). Nothing is imported here, so a process
that loads only the probe (the PyTorch server's sitecustomize) pulls in nothing else.
"""
