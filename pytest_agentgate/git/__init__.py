"""The git layer: the only place git runs, and the only code that reads or writes the base
repository's files (the agent's own ``.git`` is laid out by ``workspace.fork``, and never
run).

Owns the runner (``runner``: every git process, its safety settings and failures classified),
the repository's named operations (``repo``: objects, trees and merges, holding ``place``,
where it is and git run against it, ``refs`` and ``history`` as its parts), private index
files (``index``), the transport to a server (``transport``) and the user's checked-out
working tree following a move (``worktree``); and what it does without a git process,
exactly as git would or not at all: objects read and commits written (``objects``, packs
read by ``packs``, trees edited and work-tree blobs written by ``trees``), the plugin's own
new refs created (``ref_files``). May use: the standard library and the package's shared
modules (``errors``, ``_faults``).
"""
