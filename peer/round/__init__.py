"""The pieces of a round that do not depend on how its clients are run, written once over a
batch of clients (a client process is a batch of one) and called by both engines: the client
(:mod:`dfedrw.peer.client`) and the batched engine (:mod:`dfedrw.engines`).

:mod:`.candidates`: what a client aggregates (its own model first, the models it holds, what
their senders declared, their staleness, who is missing). :mod:`.told`: each client's rule and, under a schedule, the one told the Byzantine clients among
a round's senders. :mod:`.records`: what a round and a client's final file hold, and when an
evaluation and a checkpoint are due. :mod:`.byzantine`: a Byzantine client's step (what it declares,
its attack's view and messages, the reference it carries).
"""
