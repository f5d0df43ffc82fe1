"""Launchers: start a scenario's clients (local processes, threads, torchrun, a docker-compose
cluster, the batched engine), check it before, show progress, collect the summary."""

import dfedrw.peer  # noqa: F401 - answers imports of modules that moved out of here
