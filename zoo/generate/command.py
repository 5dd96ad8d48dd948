"""The ``zoo generate`` command line that makes a store, recorded in its manifest.

The repair of a damaged store is a rerun of the command that made it, so the manifest keeps it
(``command``) and ``zoo verify`` prints it. It is rebuilt from the options rather than taken from
``sys.argv``, so stores generated from Python record it too.
"""

from __future__ import annotations

import json
from dataclasses import fields

#: options of :class:`~zoo.generate.run.GenerateOptions` that ``zoo generate`` has no flag for
#: (``psnr_stop``: Python only; the manifest's ``generation`` still records it)
NOT_FLAGS = ("kind", "out", "progress", "group", "psnr_stop")


def command_line(opts) -> list[str]:
    """``opts`` as the ``zoo generate`` argument list that gives them (defaults left out)."""
    argv = ["zoo", "generate", opts.kind, "--out", str(opts.out)]
    for f in fields(opts):
        value = getattr(opts, f.name)
        if f.name in NOT_FLAGS or value == f.default:
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.name == "use_ray":
            argv.append("--ray" if value else "--no-ray")
        elif f.name == "source_options":
            for key, item in value.items():
                argv += ["--source-option", f"{key}={json.dumps(item)}"]
        elif f.name == "limit" and isinstance(value, dict):
            argv += [flag, ",".join(f"{split}={n}" for split, n in value.items())]
        elif value is True:
            argv.append(flag)
        else:
            argv += [flag, str(value)]
    return argv
