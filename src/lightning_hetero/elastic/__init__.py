"""Elastic local SGD: workers that leave and join a running job, on torchft (the ``[elastic]`` extra).

Importing this package does not import torchft; building a strategy's membership at ``fit`` does.
"""

from lightning_hetero.elastic.commits import CommitRecord, epoch_coverage, lineage
from lightning_hetero.elastic.membership import ElasticError
from lightning_hetero.elastic.strategy import ElasticLocalSGDStrategy

__all__ = ["CommitRecord", "ElasticError", "ElasticLocalSGDStrategy", "epoch_coverage", "lineage"]
