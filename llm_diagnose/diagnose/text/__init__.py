"""Plain-text helpers every renderer and judge shares: values in their units, control characters made
visible, Markdown-safe text. The bottom layer of llm_diagnose.diagnose: it imports nothing of it."""
