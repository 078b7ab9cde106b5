"""Moving a target to a tested tree.

Owns the targets (``target``: a branch here, on a server, or a dry run's scratch ref), the
moves that are not merges (``promote``: fast-forward, rollback, revert), the landing queue
that every merge goes through (``queue``), early re-tests (``early``), moves outside agentgate
(``external``) and pruning (``prune``).
May use: every layer below (``remote``, ``judge``, ``store``, ``workspace``, ``sandbox``,
``git``).
"""
