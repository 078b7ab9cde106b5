"""The git layer: the only place git runs, and the only code that reads or writes git's files.

Owns the runner (``runner``: every git process, its safety settings and failures classified),
the repository's named operations (``repo``), private index files (``index``), the transport
to a server (``transport``) and the user's checked-out working tree following a move
(``worktree``); and what it does without a git process, exactly as git would or not at all:
objects read and commits written (``objects``, packs read by ``packs``), the plugin's own
new refs created (``ref_files``). May use: the standard library and the package's shared
modules (``errors``, ``_faults``).
"""
