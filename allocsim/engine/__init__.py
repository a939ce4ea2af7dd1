"""The replay (docs/architecture.md, "Layers"): naming a policy (`spec`), walking a trace through it
(`replay`), folding a periodic run (`fold`) and checking a plug-in as it replays (`guard`)."""
