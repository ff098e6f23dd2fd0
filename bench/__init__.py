"""`make bench`: this consumer against Powertools and the seed articles' pattern, in one run.

Run ``python -m bench`` (``make bench``); ``python -m bench --help`` lists the knobs.
Nothing here is deployed: the Lambda package is ``src/`` alone.
"""
