"""The ``agentgate`` command and its demo.

``main`` (the command and the subcommands that read, undo and tidy), ``judging`` (``land``
and ``audit``, the subcommands that judge), ``common`` (exit codes, the usage error, finding
the repository, the branch and the records) and ``demo`` (the whole idea in one command).
May use: the engine and every layer below, never the pytest face.
"""
