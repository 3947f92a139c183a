"""Frontends: turn a framework's model into an ember Graph."""
