"""Writers of a replay in other tools' formats, the inverse of `allocsim.formats.importers`.

`torch_snapshot`: a replay as a PyTorch memory snapshot (`torch_snapshot.replay_snapshot` runs it).
"""
