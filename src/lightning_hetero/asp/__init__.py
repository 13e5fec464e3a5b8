"""Asynchronous parameter-server training (ASP) without Lightning: the wire protocol, the worker's client, the
server, its loop and optimizer, staleness rules, asynchrony compensation, sharding and its hosting, the server's
placement, the flat model layout and the fault board. ``AsyncPSStrategy``'s ASP engine
(:mod:`lightning_hetero.async_ps.engines.asp`) drives it from Lightning's hooks."""
