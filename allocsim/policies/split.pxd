# What Cython reads beside split.py in the compiled build (docs/architecture.md, "The compiled build"); split.py
# stays the definition (its @cython decorators type the hot loops' locals); interpreted, this is not read.

from allocsim.policies._sorted cimport file_key, words_at, words_drop, words_file, words_first_at_least
from allocsim.policies._latency cimport add_latency
