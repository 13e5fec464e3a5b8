"""The old module of ``AsyncPSStrategy``, kept for one release: use :mod:`lightning_hetero.async_ps`."""

from lightning_hetero._deprecation import renamed_attributes
from lightning_hetero.async_ps.strategy import AsyncPSStrategy as _AsyncPSStrategy

__getattr__ = renamed_attributes(
    __name__, {"AsyncPSStrategy": ("lightning_hetero.async_ps.AsyncPSStrategy", _AsyncPSStrategy)}
)
