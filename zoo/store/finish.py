"""Finishing a store: its content ID into the manifest, the manifest marked complete, its dataset card.

One function above the writer, the reader (the ID is computed from the files as written) and the
card, so that none of them imports another in a circle.
"""

from __future__ import annotations

from .card import write_card
from .identity import KEY, content_id
from .writer import finalize


def finish(root, manifest: dict, extra: dict) -> dict:
    """Mark the store at ``root`` complete with ``extra`` (statistics, reports) in its manifest, its
    content ID (:mod:`.identity`; none for a format-v1 store) and its ``README.md``; returns the manifest."""
    manifest.update(extra)
    manifest.pop(KEY, None)
    identity = content_id(root, manifest)
    manifest = finalize(root, manifest, {} if identity is None else {KEY: identity})
    write_card(root)
    return manifest
