"""Running what agents wrote: the sandbox, the supervisor, deletion, the agent command.

Owns the containment in force (``containment``: bwrap's command line, the read view, the
environment's allow-list), running one command under the supervisor (``process``,
``supervisor``: the latter runs as a script of its own and imports nothing of the package;
``forkserver``, its warm fork for uncontained commands; ``bwrap_run``, bwrap as the
supervisor itself), what a contained command may reach (``network``; ``egress``, the proxy
outside that lets named hosts through; ``relay``, its other end inside), the seccomp filter
(``seccomp``), what of a command's output a record shows (``excerpt``),
removal that never follows a link (``removal``) and the agent command's template
(``agent_command``). May use: the standard library and the shared modules.
"""
