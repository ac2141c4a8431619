"""What every layout of the ``transformers serve`` integration shares."""

from __future__ import annotations

import logging

from inferwatch.common.lograte import RateLimit

logger = logging.getLogger("inferwatch.run")
#: For failures on the request path: logged at most once a minute per message.
request_logger = logging.getLogger("inferwatch.run.requests")
request_logger.addFilter(RateLimit())
