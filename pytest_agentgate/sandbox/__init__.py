"""Running what agents wrote: the sandbox, the supervisor, deletion, the agent command.

Owns the containment in force (``containment``: bwrap's command line, the read view, the
environment's allow-list), running one command under the supervisor (``process``,
``supervisor``: the latter runs as a script of its own and imports nothing of the package),
removal that never follows a link (``removal``) and the agent command's template
(``agent_command``). May use: the standard library and the shared modules.
"""
