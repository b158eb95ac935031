"""Usage accounting: an append-only ledger of attempts in ``ROOT/usage/`` (written by the
daemon as attempts start and end) and the sums ``bastion usage`` and the status page show."""
