"""The error every layer may raise for a usage or configuration problem, kept apart from config.py so that what
config.py imports (the reply formats, and through them the model's interface) can raise it without an import
circle."""


class ConfigError(Exception):
    """A usage or configuration problem: reported as one line, exit code 2."""
