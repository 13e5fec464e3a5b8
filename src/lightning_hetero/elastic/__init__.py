"""Workers that leave and join a running job: elastic local SGD and synchronous HeteroBatch with a constant global
batch on torchft (the ``[elastic]`` extra), and jobs restarted by torchrun's elastic agent with each new membership
(``torchrun``, for ASP; no extra).

Importing this package does not import torchft; building a strategy's membership at ``fit`` does.
"""

from lightning_hetero.elastic.commits import CommitRecord, epoch_coverage, lineage
from lightning_hetero.elastic.membership import ElasticError
from lightning_hetero.elastic.settings import ElasticHeteroBatchAdvanced, ElasticLocalSGDAdvanced
from lightning_hetero.elastic.strategy import ElasticLocalSGDStrategy
from lightning_hetero.elastic.sync_strategy import ElasticHeteroBatchStrategy
from lightning_hetero.elastic.torchrun import TorchrunAttempt, TorchrunRestarts, attempt_reason

__all__ = [
    "CommitRecord",
    "ElasticError",
    "ElasticHeteroBatchAdvanced",
    "ElasticHeteroBatchStrategy",
    "ElasticLocalSGDAdvanced",
    "ElasticLocalSGDStrategy",
    "TorchrunAttempt",
    "TorchrunRestarts",
    "attempt_reason",
    "epoch_coverage",
    "lineage",
]
