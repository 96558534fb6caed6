import sys
from pathlib import Path

# Test the source tree, not an installed tinylm.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
