"""`make bench` (``python -m bench``): this consumer against Powertools and the seed pattern. Not deployed."""
