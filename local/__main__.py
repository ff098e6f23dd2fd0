import sys
from pathlib import Path

# The tooling reads the consumer's own names (ErrorType, Settings) from the deployed package,
# however it is started: `make` sets PYTHONPATH, `python -m local` alone does not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from local.cli import main

raise SystemExit(main())
