"""Asynchronous parameter-server training: wire protocol, server, staleness logic and the Lightning strategy.

Importing this package registers ``"async_ps"`` in Lightning's ``StrategyRegistry``.
"""

from lightning.pytorch.strategies import StrategyRegistry

from lightning_hetero.ps.strategy import AsyncPSStrategy

AsyncPSStrategy.register_strategies(StrategyRegistry)

__all__ = ["AsyncPSStrategy"]
