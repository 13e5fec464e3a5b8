"""The Lightning-side collaborators of ``AsyncPSStrategy`` that its engines share: the run's context and its
start-up (``bootstrap``), collectives, fault tolerance, data claiming (``claiming``, ``sampler``, ``claim_size``),
stopping, validation points, the Trainer's limits, reporting, checkpoints, gradient clipping and scaling."""
