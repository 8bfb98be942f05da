"""Deployment artifacts: MindIR graphs (model packages and compression arrive with the export issue)."""
