"""The pieces of a round that do not depend on how its clients are run, written once over a
batch of clients (a client process is a batch of one) and called by both engines: the client
(:mod:`dfedrw.peer.client`) and the batched engine (:mod:`dfedrw.engines`).

:mod:`.candidates`: what a client aggregates; :mod:`.told`: each client's rule and what it is
told; :mod:`.records`: what a round and a final file hold, and when evaluations and checkpoints
are due; :mod:`.byzantine`: a Byzantine client's step.
"""
