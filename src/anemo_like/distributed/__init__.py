"""Distributed launch and process groups."""
