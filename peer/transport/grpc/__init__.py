"""The gRPC transport: one server per client and a channel to each neighbour (:mod:`.transport`),
on one event loop per process (:mod:`.loop`); the server's admission of calls (:mod:`.admission`),
the sending side (:mod:`.sender`) and mutual TLS (:mod:`.tls`)."""
