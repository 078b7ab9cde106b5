"""The ``agentgate`` command and its demo. May use: the engine and every layer below,
never the pytest face."""
