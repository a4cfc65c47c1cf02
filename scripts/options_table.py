"""Print the README's options table (Markdown), made from the one declaration of each option in miniagi/config.py.

    python scripts/options_table.py

Paste its output over the table under "Options" in README.md; tests/test_docs.py fails while the two differ.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from miniagi.config import options_table  # noqa: E402

print(options_table(), end="")
