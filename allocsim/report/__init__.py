"""Reports of results, apart from the replays that made them.

Every module here reads results — a `ReplayResult` or its ``to_dict()`` form, compare/sweep rows,
a fit result, a `Tuning`, a `Validation` — and writes them for people or programs, without reaching
into the engine, so a result read back from JSON reports the same as a fresh one. The exception is
`snapshot`, which replays (a `Replay` with an observer) to write the run as a PyTorch snapshot.

- `text`: the replay summary, section table, compare table, fit table and validate's verdict;
- `tables`: rows as CSV or JSON lines, one result as JSON;
- `plots`: the pictures (matplotlib, imported only when drawing);
- `html`: the ``plot --report`` page;
- `tune`: ``allocsim tune``'s report;
- `snapshot`: a replay as a PyTorch memory snapshot, for pytorch.org/memory_viz.
"""
