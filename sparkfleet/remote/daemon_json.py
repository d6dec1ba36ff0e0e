"""daemon.json as dockerd reads it, with every runtime's path resolved to the binary it runs (JSON on stdout).

Run by sparkfleet's DaemonJson fact as `python3 -c SOURCE DAEMON_JSON RUNTIME`: stdlib only, read-only.
"""

import json
import os
import shutil
import sys

SEARCH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # dockerd's PATH under systemd


def resolve(program: str) -> str:
    """What dockerd would exec: a bare name through PATH, then every symlink followed."""
    found = program if "/" in program else shutil.which(program, path=SEARCH)
    return os.path.realpath(found) if found else program


def read(path: str, wanted: str) -> dict:
    result = {"config": None, "error": None, "resolved": {wanted: resolve(wanted)}}
    try:
        with open(path) as handle:
            text = handle.read()
    except FileNotFoundError:
        text = ""
    if text.strip():
        try:
            result["config"] = json.loads(text)
        except ValueError as error:
            result["error"] = str(error)
    config = result["config"]
    if config is not None and not isinstance(config, dict):
        result["config"], result["error"] = None, "the top level is not a JSON object"
    runtimes = config.get("runtimes") if isinstance(config, dict) else None
    for entry in runtimes.values() if isinstance(runtimes, dict) else ():
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            result["resolved"][entry["path"]] = resolve(entry["path"])
    return result


if __name__ == "__main__":
    print(json.dumps(read(sys.argv[1], sys.argv[2])))
