import sys
from pathlib import Path

# Tests import the launch helpers in tests/harness.py by plain name.
sys.path.insert(0, str(Path(__file__).parent))
