"""Writes the transformer example's text: a few modules of Python's own standard library,
a real text that ships with every Python (nothing is downloaded), to data/corpus.txt.

    python make_text.py
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = ("argparse.py", "difflib.py", "textwrap.py", "string.py", "fractions.py", "csv.py",
           "calendar.py", "pprint.py")


def main() -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "".join((stdlib / name).read_text(encoding="utf-8") for name in SOURCES)
    out = HERE / "data" / "corpus.txt"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {len(text):,} characters to {out}")


if __name__ == "__main__":
    main()
