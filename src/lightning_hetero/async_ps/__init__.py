"""``AsyncPSStrategy``: asynchronous parameter-server (ASP), synchronous (BSP) and local-SGD training in one Lightning
strategy, switchable at an epoch's end.

``strategy`` is the Lightning strategy, ``settings`` its checked constructor arguments (the expert knobs in
``PSAdvanced``), ``engines/`` one engine per mode, and ``runtime/`` the Lightning-side collaborators the engines share
(collectives, faults, data claiming, stopping and validation points, reporting, checkpoints). The modes' pure logic lives in :mod:`lightning_hetero.asp`
and :mod:`lightning_hetero.local_sgd`. ``AsyncPSStrategy`` loads on first use, so that a module of ``runtime/``
(the claim sampler's order, which ``elastic/`` shares) loads alone.
"""

from typing import TYPE_CHECKING

from lightning_hetero._lazy import lazy_attributes

if TYPE_CHECKING:
    from lightning_hetero.async_ps.settings import PSAdvanced
    from lightning_hetero.async_ps.strategy import AsyncPSStrategy

__all__ = ["AsyncPSStrategy", "PSAdvanced"]
__getattr__ = lazy_attributes(
    __name__,
    {"AsyncPSStrategy": "lightning_hetero.async_ps.strategy", "PSAdvanced": "lightning_hetero.async_ps.settings"},
)
