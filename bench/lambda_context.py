"""The ``context`` Lambda passes a handler: what Powertools reads, and a clock that runs down."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field


@dataclass
class InvocationContext:
    timeout_ms: int = 60_000
    function_name: str = "bench-consumer"
    function_version: str = "$LATEST"
    memory_limit_in_mb: int = 1024
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:000000000000:function:bench-consumer"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    _started: float = field(default_factory=time.monotonic, repr=False)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, self.timeout_ms - int((time.monotonic() - self._started) * 1000))
