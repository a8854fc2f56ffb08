"""Thin translators from a framework's hooks to `Monitor` calls."""
