"""The benchmark's pure modules live in e2e/bench_e2e (next to the cluster code they serve);
put e2e/ on the path so that `import bench_e2e` finds them."""

import sys
from pathlib import Path

E2E_DIR = Path(__file__).resolve().parents[3] / "e2e"
if str(E2E_DIR) not in sys.path:
    sys.path.insert(0, str(E2E_DIR))
