"""`miniagi ui`: watch and inspect runs in a browser (optional extra: pip install "miniagi[ui]")."""
