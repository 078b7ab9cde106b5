"""The git layer: the only place git runs.

Owns the runner (``runner``: every git process, its safety settings and failures classified),
the repository's named operations (``repo``), private index files (``index``), the transport
to a server (``transport``) and the user's checked-out working tree following a move
(``worktree``). May use: the standard library and the package's shared modules (``errors``,
``_faults``).
"""
