"""Graph passes, one per file."""
