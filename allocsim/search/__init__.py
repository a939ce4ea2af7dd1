"""Many replays (docs/architecture.md, "Layers"): compare and sweep, fit the least capacity, tune a
framework's settings (its spaces of settings to try in `spaces`), tune every rank of a run, and validate a
model against a recording."""
