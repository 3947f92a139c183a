"""Loads and runs compiled artifacts.  Imports only the standard library and numpy."""
