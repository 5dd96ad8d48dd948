"""Batched classifier training for classifier zoos: many MLPs as one computation.

``mlp`` (the stacked networks, forward and hand-written backward), ``runs`` (each run's seed,
classes and hyperparameters), ``schedule`` (Adam, batches, checkpoints), ``data`` (images as the
networks see them, each run's batches), ``trainer`` (the batched loop, non-finite handling),
``evaluate`` (test accuracy), ``reference`` (one network at a time, the yardstick).
"""
