"""Engines that run every client of a run in one process. The batched engine
(``engine.name = "batched"``): the honest clients' models as the rows of one tensor (:mod:`.run`,
one run), a round of one or several runs together (:mod:`.together`), asynchronous gossip
(:mod:`.gossip`), links and compression (:mod:`.network`) on a simulated clock (:mod:`.clock`). The
other engine is the client itself (:mod:`dfedrw.peer.client`), one per process or thread; both write
a round through :mod:`dfedrw.peer.client.rounds`. Launchers (:mod:`dfedrw.launch`) start them."""
