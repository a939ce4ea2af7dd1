"""Traces from and to other formats (docs/architecture.md, "Layers"): importers (PyTorch snapshots, RMM CSV,
CuPy JSONL), recorders (a running PyTorch or CuPy program), exporters (a replay as a PyTorch snapshot) and
generated traces (`synth`). The event model and the ``.bin`` format itself are `allocsim.trace`, below."""
