# What Cython reads beside split.py in the compiled build (docs/architecture.md, "The compiled build"); split.py
# stays the definition (its @cython decorators type the hot loops' locals); interpreted, this is not read.

from allocsim.policies._sorted cimport first_at_least, first_at_least_word, file_key
from allocsim.policies._latency cimport add_latency
