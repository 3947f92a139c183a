"""The served artifacts (``served_models.py``) as a session fixture of this directory."""

from served_models import artifacts  # noqa: F401  (a pytest fixture)
