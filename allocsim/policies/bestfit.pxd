# What Cython reads beside bestfit.py in the compiled build (docs/architecture.md, "The compiled build");
# bestfit.py stays the definition (its @cython decorators type the fused loop's locals); interpreted, this is
# not read.

from allocsim.policies._sorted cimport drop_key, key_place, put_key, put_word, word_place, words_at
from allocsim.policies._latency cimport add_latency
