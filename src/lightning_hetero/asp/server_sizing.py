"""Server sizing: the documented rule for ``server_shards`` and ``server_placement``, applied to what the server
measured in the first ASP epoch (pure logic).

One server costs ``u`` µs per MB of parameters per update, so it applies ``C = 10^6 / u`` MB/s; N workers making
``r`` updates/s each on an ``M``-MB model demand ``D = N r M`` MB/s. ``D / C`` is the fraction of the time the
server is busy applying updates, which the server measures directly (``busy_fraction``). The rule: shard when
``D / C > 0.5``, into ``k = ceil(D / (0.5 C))`` shards, each on a host with a spare core; a dedicated server rank
only when the server is that busy and rank 0 trains fewer samples than workers of its speed. A checkpoint resumes
with any number of shards, so the advice can be taken at the next start.

Example::

    >>> advice = sizing_advice({"busy_fraction": 0.75, "us_per_update": 1250.0,
    ...     "us_per_mb": 500.0}, shards=1)
    >>> advice.shards, advice.busy_fraction
    (2, 0.75)
    >>> print(advice.message)  # doctest: +NORMALIZE_WHITESPACE
    AsyncPSStrategy: server sizing from the first ASP epoch: 600 updates/s at 500 us/MB (2.5 MB), the server busy 75%
    of the time: the rule (shard above 50%) recommends server_shards=2, each shard on a host with a spare core
    (a checkpoint resumes with any number of shards); server_placement='dedicated' only if rank 0 also trains fewer
    samples than workers of its speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: the busy fraction above which the rule shards the server
BUSY_LIMIT = 0.5


@dataclass(frozen=True)
class SizingAdvice:
    """What the rule recommends from one epoch's server statistics, and the one line that says it with the numbers."""

    #: the recommended number of shards (the current one when the server is not busy enough to shard)
    shards: int
    #: the fraction of the time the (busiest measured) server spent applying updates: ``D / C``
    busy_fraction: float
    #: the line printed once and logged
    message: str


def sizing_advice(statistics: dict[str, Any], shards: int) -> SizingAdvice:
    """The rule applied to a server's :meth:`~lightning_hetero.asp.server.ParameterServer.statistics`, with
    ``shards`` shards now (the update rate is the busy fraction over the cost of one update).

    Args:
        statistics: the server's statistics (``busy_fraction``, ``us_per_update``, ``us_per_mb``).
        shards: the current ``server_shards``.
    """
    busy = float(statistics["busy_fraction"])
    us_per_mb = float(statistics["us_per_mb"])
    us_per_update = float(statistics["us_per_update"])
    megabytes = us_per_update / us_per_mb if us_per_mb > 0 else 0.0
    rate = busy / us_per_update * 1e6 if us_per_update > 0 else 0.0
    measured = (
        f"AsyncPSStrategy: server sizing from the first ASP epoch: {rate:.0f} updates/s at {us_per_mb:.0f} us/MB "
        f"({megabytes:.3g} MB), the server busy {busy:.0%} of the time"
    )
    if busy <= BUSY_LIMIT:
        return SizingAdvice(
            shards,
            busy,
            f"{measured}: the rule (shard above {BUSY_LIMIT:.0%}) keeps server_shards={shards} and "
            "server_placement='worker'.",
        )
    recommended = max(shards, math.ceil(shards * busy / BUSY_LIMIT))
    return SizingAdvice(
        recommended,
        busy,
        f"{measured}: the rule (shard above {BUSY_LIMIT:.0%}) recommends server_shards={recommended}, each shard on "
        "a host with a spare core (a checkpoint resumes with any number of shards); server_placement='dedicated' "
        "only if rank 0 also trains fewer samples than workers of its speed.",
    )
