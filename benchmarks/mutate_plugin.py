"""pytest plugin for `mutate.py`'s runs: hypothesis stops at the first failing example.

A mutant is killed by the first failure; shrinking it to a small example would
only cost time. Loaded with ``-p mutate_plugin`` (``benchmarks/`` on the path),
before the test modules build their ``settings``, which inherit these phases.
"""
from hypothesis import Phase, settings

settings.register_profile("mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate])
settings.load_profile("mutation")
