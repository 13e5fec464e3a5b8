"""What every study shares: launching ranks (:mod:`.launch`), recording results with their conditions
(:mod:`.record`), the emulated-compute models (:mod:`.models`), statistics (:mod:`.stats`), the grid of conditions
(:mod:`.grid`) and the command line (:mod:`.cli`)."""
