"""Turn titles into the short names used in page addresses."""
import re


def slugify(title):
    """'Hello, World!' -> 'hello-world'"""
    words = re.findall(r"[a-z0-9]+", title)
    return "-".join(words)
