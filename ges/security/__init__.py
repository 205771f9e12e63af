"""Security: the network's certificates and who they name (issue 19)."""
