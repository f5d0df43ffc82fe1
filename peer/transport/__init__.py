"""How models cross between clients, independent of the learning: what a client needs from a
transport (:mod:`.base`), the kinds a scenario can name (:mod:`.kinds`), the wire format
(:mod:`.serde`, :mod:`.chunks`, :mod:`.framing`, the schema in :mod:`.pb`), the checked receive
path (:mod:`.intake`) into the round's inbox (:mod:`.inbox`), each client's certificate
(:mod:`.identity`), and the implementations: gRPC (:mod:`.grpc`), in-process (:mod:`.inproc`) and
torch.distributed (:mod:`.torchdist`)."""
