"""Wire contracts shared by the agent and the controller."""
