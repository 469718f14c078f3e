"""hetbench harness: orchestration, the training loop, communication and the collector.

Nothing here imports a framework at module level: `hetbench --help` must stay light.
"""

from __future__ import annotations

__version__ = "0.1.0"
SCHEMA_VERSION = 1
