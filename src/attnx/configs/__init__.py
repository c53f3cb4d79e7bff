"""The configs shipped with attnx: the paper's base and big models, a one-machine Multi30k run, a tiny
smoke-test run and the Table 3 variations (override configs merged over ``base``).

The repository's ``configs/`` folder is this package; installed from a wheel they are found by name, so
``attnx fit --config base`` works outside a clone.
"""
