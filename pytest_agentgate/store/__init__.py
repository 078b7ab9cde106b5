"""The plugin's own state on disk and in git: one place each is written and read.

Owns locks (``locks``), the operations log (``oplog``), pending lines of a move
(``pending``), whole-file writes (``files``), layout and format versions (``schema``),
attempt records and their messages (``records``, ``attempts``) and checkpoints
(``checkpoints``). May use: ``git``, ``sandbox``, ``workspace`` (an attempt record carries
the declared state captured from its workspace) and the shared modules.
"""
