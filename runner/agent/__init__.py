"""The agent: wires inputs, services, the machine and the state handlers, and runs one job on a node."""
