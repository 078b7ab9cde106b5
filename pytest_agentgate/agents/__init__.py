"""Real coding agents as agent commands: their presets, their usage, their transcripts.

``presets`` holds what each known CLI needs to run contained (its command for one task, the
environment names it reads, the model API it may reach, the flags that keep it from calling
home); ``reading`` prepares one run of an agent command (what it must see) and reads what it
left; ``usage`` reads what an agent reports of its own tokens, cost and steps; ``transcript``
turns an agent's step-by-step stream into text a person reads. May use: the sandbox's values
(``network``, ``agent_command``) and the shared modules.
"""
