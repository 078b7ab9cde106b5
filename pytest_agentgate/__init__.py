"""pytest-agentgate."""
