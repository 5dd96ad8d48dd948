"""Ray's token-authentication notice, silenced for the local cluster ``zoo generate`` starts itself.

Ray 2.5x enables token authentication on every new local cluster and logs a WARNING saying so on
every ``ray.init()`` (``ray._private.authentication.authentication_token_setup``). For the
embedded, loopback-only cluster of one ``zoo generate`` run that notice says nothing to act on, so
it is dropped; token authentication itself stays on. Joining a cluster (``--address``) never logs
it, and every other Ray message is left alone. (``zoo train --workers N`` starts its cluster with
``logging_level=ERROR``, which drops it too.)
"""

from __future__ import annotations

import logging

LOGGER = "ray._private.authentication.authentication_token_setup"
NOTICE = "Token authentication is enabled for this Ray cluster"


class _DropTokenNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(NOTICE)


def quiet_token_notice() -> None:
    """Drop Ray's token-authentication notice from now on (idempotent; imports nothing of Ray)."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(f, _DropTokenNotice) for f in logger.filters):
        logger.addFilter(_DropTokenNotice())
