"""Reading a generated compose service's command: what the compose tests share."""


def peers_of(command: list[str]) -> dict[int, str]:
    """``--peer ID=ADDRESS`` pairs of a command, the Byzantine services' ``sh -c`` line included."""
    words = command[2].split() if command[:2] == ["sh", "-c"] else command
    pairs = [words[i + 1] for i, w in enumerate(words) if w == "--peer"]
    return {int(p.split("=")[0]): p.split("=", 1)[1] for p in pairs}
