"""Real-engine demo harness: a locally made tiny Llama model and real serving processes."""
