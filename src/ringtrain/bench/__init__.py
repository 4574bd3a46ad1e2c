"""``ringtrain bench`` (cli.py) and the models and data the examples and benchmarks share (models.py, datasets.py)."""
