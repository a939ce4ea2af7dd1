"""Writers of a replay in other tools' formats, the inverse of `allocsim.importers`.

`torch_snapshot`: a replay as a PyTorch memory snapshot (`allocsim.replay.replay_snapshot` runs it).
"""
