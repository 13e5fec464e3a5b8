"""Local SGD without Lightning: rounds of local steps ended by an all-reduce of pseudo-gradients (``rounds``), the
outer optimizer that applies them (``outer_optimizer``), each round's budget and local steps per rank
(``round_plan``) and the last rounds planned in steps (``local_stop``). Shared by ``AsyncPSStrategy(mode="local")``
and ``ElasticLocalSGDStrategy``."""
