"""The plugin's own state on disk and in git: one place each is written and read.

Owns locks (``locks``), the operations log (``oplog``), pending lines of a move
(``pending``), whole-file writes (``files``), layout and format versions (``schema``),
attempt records (``record``, the one value; ``records``, their messages; ``attempts``,
reading them back), the whole gate log beside a record (``logs``), which landings a later
move undid (``undone``), checkpoints (``checkpoints``) and the name of an attempt's declared
state (``state_refs``; capturing and restoring it is the workspace's). It stands below the
workspace it persists: May use: ``git``, ``sandbox`` and the shared modules.
"""
