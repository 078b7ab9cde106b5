"""Moving a target to a tested tree.

Owns the targets (``target``: a branch here; ``remote_branch``: a branch on a server;
``dry_run``: a run's scratch ref), the moves that are not merges (``promote``: fast-forward,
rollback, revert), the landing queue that every merge goes through (``queue``, the waiter's
side; ``leader``, a batch merged, re-tested once and bisected, its decisions pure functions
in ``planning``; ``recovery``, what a dead
waiter or leader left; ``posting``, attempts on a server's queue; ``queue_folder``, the
queue's files), the re-test of a merged tree (``retest``) and early re-tests (``early``), the
shape a landing takes (``landings``: merge, squash, rebase), naming what an attempt clashes
with (``clashes``), and moves outside agentgate (``external``). (Pruning is ``maintenance``'s.)
May use: every layer below (``remote``, ``judge``, ``store``, ``workspace``, ``sandbox``,
``git``).
"""
