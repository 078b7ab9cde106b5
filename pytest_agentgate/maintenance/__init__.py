"""Keeping the plugin's own state tidy: what a person or a run removes when it is old.

``prune`` removes old attempt records (never one that landed), their state, checkpoints and
logs, old dry runs' scratch refs and old run directories, and rotates the operations log,
here and on a server. It stands beside the layers it tidies, above them all but the engine:
nothing in the lifecycle calls it. May use: ``land``, ``remote``, ``store``, ``workspace``,
``sandbox``, ``git`` and the shared modules.
"""
